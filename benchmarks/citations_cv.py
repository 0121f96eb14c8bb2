"""2-fold cross-validation inside the development split for the constraint weights' settings.

Run by hand, after ``betheproj citations --data DIR --out citations-results`` (which writes the model):

    python benchmarks/citations_cv.py --data ../shared/data/umass_citation/original \
        --model citations-results/model.pt [--set epochs=15] [--set length_agreement=none] [--seeds 0 1 2]

The dev F1 of the non-local row is measured on the citations its weights ``c`` were learned on, so it flatters
every setting that fits ``c`` harder. Here dev is split in two random halves; ``c`` is learned by Algorithm 3 on
each half (the saved run's settings, with ``--set`` overrides of :class:`CitationConfig` fields: those of
learning c, ``epochs``, ``psi_lr``, ``batch_size``, ``train_iter``, and those of the templates, which are
instantiated again on the training split, ``length_agreement``, ``order_agreement``, ``format_together``
(``none``: without that family), ``min_support``, ``min_agreement``, ``hinge_width``) and the other half is
tagged; the F1 over all of dev's held-out predictions is printed for each seed (the seed picks the halves and
the minibatch order). The base CRF is the saved one throughout.

``--cross-fit K`` asks whether the training split's K-fold cross-fitted potentials help (``betheproj citations
--cross-fit K``): each half's ``c`` is learned twice, on the half alone and on the half pooled with the 1,457
held-out training citations (:func:`cross_fit_potentials`, computed once, with the saved run's seed; 5 base CRFs,
about 10 min), and both F1s are printed.

``--mbr T`` scores the held-out halves decoded for segment F1 as well (the segments more probable than ``T``,
:func:`betheproj.inference.decode_segments`, as the run's ``non-local, MBR`` row decodes), beside Proposition 1's MAP.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from _common import distinct, run, seed_int

from betheproj.cli import _unit_float, int_type
from betheproj.data.citations import load_citations
from betheproj.experiments.citations import (
    constraint_model,
    cross_fit_potentials,
    learn_pooled_weights,
    learn_weights,
    load_run,
    nonlocal_tagger,
    predictions,
    templates,
)
from betheproj.inference import BIOFields
from betheproj.learning.metrics import segment_f1


def _optional(value: str) -> float | None:
    return None if value.lower() == "none" else float(value)


TUNABLE = {"epochs": int, "batch_size": int, "train_iter": int, "psi_lr": float, "min_support": int,
           "min_agreement": float, "hinge_width": float, "length_agreement": _optional,
           "order_agreement": _optional, "format_together": _optional}


def override(text: str) -> tuple[str, int | float | None]:
    key, _, value = text.partition("=")
    if key not in TUNABLE:
        raise argparse.ArgumentTypeError(f"--set takes one of {sorted(TUNABLE)}=VALUE, got {text!r}")
    try:
        return key, TUNABLE[key](value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--set {key} takes a number, got {value!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding training.docs(.gz), dev.docs(.gz), ...")
    parser.add_argument("--model", default="citations-results/model.pt", help="model.pt of a citations run")
    parser.add_argument("--set", type=override, action="append", default=[], metavar="KEY=VALUE",
                        help=f"a setting for learning c, one of {sorted(TUNABLE)}")
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0])
    parser.add_argument("--cross-fit", type=int_type(2), default=0, metavar="K",
                        help="also learn each half's c with the training split's K-fold cross-fitted potentials")
    parser.add_argument("--mbr", type=_unit_float, default=None, metavar="T",
                        help="also score the halves decoded for segment F1 at threshold T")
    args = parser.parse_args()
    distinct(parser, "--seeds", args.seeds)
    try:
        index, saved_model, saved, _ = load_run(args.model)
    except FileNotFoundError as error:
        parser.error(f"--model: {error}")
    config = dataclasses.replace(saved, **dict(args.set))
    data = load_citations(args.data)
    dev = data["dev"]
    constraints, order, formats = templates(data["train"], index.labels, config)
    model = constraint_model(saved_model.theta, constraints, config, order, formats)
    print(f"{len(constraints)} count, {len(order or [])} order, {len(formats or [])} name-format templates")
    x, y, n = index.encode(dev)
    ways = {"": None}
    if args.cross_fit:
        start = time.perf_counter()
        pool_config = dataclasses.replace(config, cross_fit=args.cross_fit)
        ways = {"half alone": None,
                f"with the {args.cross_fit}-fold pool": (cross_fit_potentials(data["train"], index, pool_config),
                                                         index.encode(data["train"]))}
        print(f"cross-fitted potentials of {len(data['train'])} training citations "
              f"({time.perf_counter() - start:.0f} s)")
    decoders = [""] if args.mbr is None else ["MAP", f"MBR {args.mbr:g}"]       # the outputs of one solve
    fields, thresholds = BIOFields.from_labels(index.labels), [] if args.mbr is None else [args.mbr]
    scores: dict[str, list[float]] = {f"{way}{', ' if way and d else ''}{d}": [] for way in ways for d in decoders}
    for seed in args.seeds:
        seeded = dataclasses.replace(config, seed=seed)
        perm = torch.randperm(len(dev), generator=torch.Generator().manual_seed(seed))
        halves = (perm[: len(dev) // 2], perm[len(dev) // 2:])
        for way, pool in ways.items():
            start = time.perf_counter()
            gold: list = []
            pred: dict[str, list] = {d: [] for d in decoders}
            each: dict[str, list[float]] = {d: [] for d in decoders}
            for fit, tag in (halves, halves[::-1]):
                if pool is None:
                    learn_weights(model, (x[fit], y[fit], n[fit]), config, seed=seed)
                else:
                    learn_pooled_weights(model, pool[0], pool[1], (x[fit], y[fit], n[fit]), seeded)
                held = [dev[i] for i in tag.tolist()]
                gold += [c.labels for c in held]
                tagger = nonlocal_tagger(model, config.test_iters[-1], fields, thresholds)
                for d, labels in zip(decoders, predictions(tagger, index, held, (x[tag], y[tag], n[tag])),
                                     strict=True):
                    pred[d] += labels
                    each[d].append(100 * segment_f1([c.labels for c in held], labels).f1)
            for d in decoders:
                key = f"{way}{', ' if way and d else ''}{d}"
                scores[key].append(100 * segment_f1(gold, pred[d]).f1)
                halves_text = " / ".join(f"{f:.2f}" for f in each[d])
                print(f"seed {seed}{f', {key}' if key else ''}: 2-fold CV F1 in dev {scores[key][-1]:.2f} (the "
                      f"halves {halves_text}; {time.perf_counter() - start:.0f} s)")
    settings = ", ".join(f"{k}={v}" for k, v in args.set) or "the saved run's settings"
    for way, got in scores.items():
        print(f"{settings}{f', {way}' if way else ''}: mean {sum(got) / len(got):.2f} over seeds {args.seeds}")


if __name__ == "__main__":
    run(main)
