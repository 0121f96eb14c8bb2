"""Data loaders; each takes a path and names the file it expects."""

from .citations import Citation, load_citations, read_citations, tokenize_citation
from .conllu import Sentence, format_conllu, load_conllu, parse_conllu, read_conllu, write_conllu
from .ocr import OCRData, load_ocr

__all__ = ["Citation", "load_citations", "read_citations", "tokenize_citation", "OCRData", "load_ocr", "Sentence",
           "format_conllu", "load_conllu", "parse_conllu", "read_conllu", "write_conllu"]
