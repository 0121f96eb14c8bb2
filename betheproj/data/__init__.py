"""Data loaders; each takes a path and names the file it expects."""

from .ocr import OCRData, load_ocr

__all__ = ["OCRData", "load_ocr"]
