"""The OCR experiment (section 8.2): its pieces on hand-made inputs, and one fold of the real data."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from betheproj.data import load_ocr
from betheproj.experiments import ocr
from betheproj.learning.psi import RandomFourierFeatures

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ocr"
needs_data = pytest.mark.skipif(not (DATA / "ocr_letters.npz").is_file(), reason="../shared/data/ocr not present")


def _labels(words):
    n = max(len(w) for w in words)
    labels = torch.full((len(words), n), -1)
    for i, w in enumerate(words):
        labels[i, : len(w)] = torch.tensor(w)
    return labels, torch.tensor([len(w) for w in words])


def test_word_and_unigram_prototypes():
    labels, lengths = _labels([(1, 2), (0, 3, 1), (1, 2), (2, 1), (3, 0, 1)])
    protos, plen = ocr.word_prototypes(labels, lengths, num_labels=4)
    assert plen.tolist() == [2, 2, 3, 3]
    assert protos.argmax(-1)[:, :2].tolist() == [[1, 2], [2, 1], [0, 3], [3, 0]]
    assert protos.sum((1, 2)).tolist() == [2, 2, 3, 3] and (protos[:2, 2] == 0).all()
    unigrams = ocr.unigram_prototypes(labels, lengths, num_labels=4)
    assert sorted(map(tuple, unigrams.tolist())) == [(0.0, 1.0, 1.0, 0.0), (1.0, 1.0, 0.0, 1.0)]


def test_median_bandwidth_is_the_median_pairwise_distance():
    pixels = torch.zeros(1, 4, 2)
    pixels[0, 1] = torch.tensor([3.0, 0.0])
    pixels[0, 2] = torch.tensor([0.0, 4.0])
    pixels[0, 3] = torch.tensor([100.0, 100.0])                  # padding: ignored
    assert ocr.median_bandwidth(pixels, torch.tensor([3])) == pytest.approx(4.0)   # distances 3, 4, 5


def test_median_bandwidth_refuses_a_sample_of_fewer_than_two_letters():
    """sample=0, 1 or True gave NaN, sample=-1 silently left out the last letter, and 2.5 was slicing's TypeError."""
    pixels = torch.rand(2, 3, 8, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([3, 2])
    for sample, error in ((0, ValueError), (1, ValueError), (-1, ValueError), (True, TypeError), (2.5, TypeError)):
        with pytest.raises(error, match="sample must be an int"):
            ocr.median_bandwidth(pixels, lengths, sample=sample)
    assert ocr.median_bandwidth(pixels, lengths, sample=2) > 0


def test_word_prototypes_refuse_padding_inside_a_word_and_letters_out_of_range():
    """A length past the labels (or a -1 inside a word) became the letter 25 (z) through negative indexing, a
    length past the padded width was cut short silently, a letter >= num_labels was a bare IndexError and no
    words at all max()'s ValueError."""
    labels, lengths = _labels([(1, 2), (0,)])
    refused = r"(labels must lie in 0..3 inside each word|lengths must lie in \[1, 2\])"
    for bad_lengths in (torch.tensor([2, 2]), torch.tensor([3, 1]), torch.tensor([0, 1])):
        with pytest.raises(ValueError, match=refused):
            ocr.word_prototypes(labels, bad_lengths, num_labels=4)
    with pytest.raises(ValueError, match="labels must lie in 0..1 inside each word"):
        ocr.word_prototypes(labels, lengths, num_labels=2)
    with pytest.raises(ValueError, match="labels hold no words"):
        ocr.word_prototypes(labels[:0], lengths[:0])
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
        ocr.word_prototypes(labels, lengths[:1])


def _synthetic_words(seed=0, per_word=12, noise=0.15):
    """Words over letters whose 128-pixel images are fixed random templates plus bit flips."""
    gen = torch.Generator().manual_seed(seed)
    vocab = [(0, 1, 2), (2, 3, 0), (3, 4), (4, 5), (0, 0, 5, 1), (5, 2)]         # no anagrams: the mean map
    # is blind to letter order
    templates = (torch.rand(26, 128, generator=gen) < 0.5).float()
    words = [w for w in vocab for _ in range(per_word)]
    labels, lengths = _labels(words)
    pixels = templates[labels.clamp(min=0)]
    flips = torch.rand(pixels.shape, generator=gen) < noise
    pixels = torch.where(flips, 1 - pixels, pixels) * (labels >= 0)[..., None]
    return pixels, labels, lengths


def test_word_classifier_learns_and_keeps_to_the_length():
    pixels, labels, lengths = _synthetic_words()
    protos, plen = ocr.word_prototypes(labels, lengths)
    clf = ocr.WordClassifier(RandomFourierFeatures(128, 200, 4.0, seed=0), protos, plen)
    clf.fit(pixels[::2], labels[::2], lengths[::2], l2=1e-4, max_iter=100)
    pred = clf.predict(pixels[1::2], lengths[1::2])
    assert pred.shape == labels[1::2].shape
    assert ((pred >= 0) == (labels[1::2] >= 0)).all()                            # a word of the input's length
    assert (pred == labels[1::2]).all()


def test_word_classifier_refuses_words_it_has_no_prototype_for():
    pixels, labels, lengths = _synthetic_words()
    keep = lengths == 3                                       # prototypes of the 3-letter words only
    protos, plen = ocr.word_prototypes(labels[keep], lengths[keep])
    clf = ocr.WordClassifier(RandomFourierFeatures(128, 200, 4.0, seed=0), protos, plen)
    with pytest.raises(ValueError, match=r"labels: training words \[.*\] are none of the prototypes"):
        clf.fit(pixels, labels, lengths, max_iter=5)
    clf.fit(pixels[keep], labels[keep], lengths[keep], max_iter=5)
    with pytest.raises(ValueError, match=r"lengths: no prototype word has the length of words .*\(lengths \[2, 4\]\)"):
        clf.predict(pixels, lengths)
    with pytest.raises(ValueError, match=r"prototypes must be one-hot words \[P, N, 26\]"):
        ocr.WordClassifier(RandomFourierFeatures(128, 200, 4.0, seed=0), protos[..., :10], plen)


def write_synthetic_npz(path: Path, folds: int = 3, seed: int = 0) -> None:
    """A tiny data set in the layout of ocr_letters.npz (one row per letter)."""
    pixels, labels, lengths = _synthetic_words(seed, per_word=folds * 2, noise=0.1)
    word_id, position = torch.nonzero(labels >= 0, as_tuple=True)
    letters = "abcdefghijklmnopqrstuvwxyz"
    np.savez(path, X=pixels[word_id, position].numpy().astype(np.uint8), y=labels[word_id, position].numpy(),
             word_id=word_id.numpy(), position=position.numpy(),
             word=np.array(["".join(letters[j] for j in w[:n].tolist()) for w, n in zip(labels, lengths.tolist(),
                                                                                           strict=True)]),
             word_fold=(torch.arange(len(lengths)) % folds).numpy(), word_len=lengths.numpy())


@pytest.mark.parametrize("row", ["Lu-mm", "Lw-mm", "55class"])
def test_training_letters_mostly_identical_are_named_before_the_fold_trains(tmp_path, monkeypatch, row):
    """Their median distance, which scales the RBF bandwidth, is 0 (NaN for a single letter): the mean-map rows failed
    with "bandwidth must be a finite number > 0, got 0.0" after the fold's other rows had trained."""
    def trains(*args, **kwargs):
        raise AssertionError("the fold was trained")

    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    data.pixels.zero_()
    monkeypatch.setattr(ocr, "fit_crf", trains)
    with pytest.raises(ValueError, match=r"^fold 0: the training letters are mostly identical or fewer than two "
                                         r"\(their median distance, which scales the RBF bandwidth of the Lu-mm, "
                                         r"Lw-mm and 55class rows, is 0.0\): leave those rows out$"):
        ocr.run(data, [0], ["2gram", row])


@pytest.mark.parametrize("rows, error, message", [
    ([], ValueError, r"^rows must name at least one row"),
    (["2gram", "Lu", "2gram"], ValueError, r"^rows must name each row once .*got \['2gram', 'Lu', '2gram'\]"),
    ("2gram", TypeError, r"^rows must be a sequence of row names .*got str '2gram'"),
    ([["2gram"]], ValueError, r"^rows must be among .*got \[\['2gram'\]\]"),
])
def test_rows_none_repeated_or_one_string_are_refused_before_a_fold_trains(tmp_path, monkeypatch, rows, error,
                                                                             message):
    """rows=[] trained each fold's base CRF and returned no row; a repeated row was listed twice in the table; a str
    was read letter by letter ("got ['2', 'g', ...]"), and a list in it was an unhashable-type TypeError."""
    def trains(*args, **kwargs):
        raise AssertionError("the fold was trained")

    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    monkeypatch.setattr(ocr, "fit_crf", trains)
    with pytest.raises(error, match=message):
        ocr.run(data, [0], rows)
    with pytest.raises(error, match=message):
        ocr.run_fold(data, 0, rows)


@pytest.mark.parametrize("data", [None, {"pixels": torch.zeros(1)}], ids=["None", "dict"])
def test_data_of_another_type_is_a_type_error_naming_data(data):
    """ocr.run(None, [0]), run_fold and check_folds raised "'NoneType' object has no attribute 'folds'"."""
    for call in (lambda: ocr.run(data, [0]), lambda: ocr.run_fold(data, 0), lambda: ocr.check_folds(data, [0])):
        with pytest.raises(TypeError, match=r"^data must be an OCRData \(as load_ocr returns\), got "):
            call()


def test_a_log_that_is_not_callable_is_refused_before_a_fold_trains(tmp_path, monkeypatch):
    """ocr.run(..., log="log.txt") trained the fold's base CRF, then failed as "'str' object is not callable"."""
    def trains(*args, **kwargs):
        raise AssertionError("the fold was trained")

    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    monkeypatch.setattr(ocr, "fit_crf", trains)
    for call in (lambda: ocr.run(data, [0], ["2gram"], log="log.txt"),
                 lambda: ocr.run_fold(data, 0, ["2gram"], log="log.txt")):
        with pytest.raises(TypeError, match=r"^log must be None or a callable taking one str \(e\.g\. print\), got "
                                            r"str 'log\.txt'$"):
            call()


def test_run_on_synthetic_data_every_row(tmp_path):
    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    config = ocr.OCRConfig(rff_features=100, crf_iter=30, test_iters=(1, 5), classifier_iter=30)
    results = ocr.run(data, folds=[0], config=config)
    json.dumps(results)                                                          # JSON-ready
    assert set(results["mean"]) == set(ocr.ROWS)
    # the synthetic words are separable (the word classifier test learns them to 100%): every row measured 100.0
    assert all(95 <= v <= 100 for v in results["mean"].values()), results["mean"]
    fold = results["folds"][0]
    assert all(95 <= v <= 100 for curve in fold["curve"].values() for v in curve), fold["curve"]
    assert len(fold["curve"]["Lw"]) == 2 and len(fold["iterations"]["Lu"]) == int((data.folds == 0).sum())
    table = ocr.format_table(results)
    for key, value in ocr.PAPER.items():
        assert f"{value:.2f}" in table, key
    ocr.plot_iterations(results, str(tmp_path / "a.png"))
    ocr.plot_histogram(results, str(tmp_path / "b.png"))
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "b.png").stat().st_size > 1000


def test_run_on_the_accelerator_matches_the_cpu(tmp_path, accelerator):
    """The same seeded draws on every device; on the separable synthetic words every row scores the same."""
    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    config = ocr.OCRConfig(rff_features=100, crf_iter=30, test_iters=(1, 5), classifier_iter=30)
    cpu, dev = ocr.run(data, folds=[0], config=config), ocr.run(data, folds=[0], config=config, device=accelerator)
    assert cpu["device"] == "cpu" and dev["device"] == str(accelerator)
    assert dev["mean"] == pytest.approx(cpu["mean"], abs=1e-9)
    # psi is learned in float32 over hundreds of steps: on an H100 it ended 3e-3 (relative) from the CPU's
    for key, value in cpu["folds"][0]["psi"].items():
        assert dev["folds"][0]["psi"][key] == pytest.approx(value, rel=2e-2), key
    assert dev["folds"][0]["bandwidth"] == pytest.approx(cpu["folds"][0]["bandwidth"], rel=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="test_iters"):
        ocr.OCRConfig(test_iters=(5, 2))
    pixels, labels, lengths = _synthetic_words()
    from betheproj.data.ocr import OCRData
    data = OCRData(pixels, labels, lengths, torch.zeros(len(lengths), dtype=torch.long), ["x"] * len(lengths))
    with pytest.raises(ValueError, match="rows"):
        ocr.run_fold(data, 0, rows=["3gram"])
    with pytest.raises(ValueError, match="fold 4"):
        ocr.run_fold(data, 4, rows=["2gram"])
    with pytest.raises(ValueError, match="key must be one of"):
        ocr.energy_model("2gram", None, None, None, None, ocr.OCRConfig(), 1.0)
    with pytest.raises(ValueError, match="folds must name at least one fold"):
        ocr.run(data, [], ["2gram"])
    with pytest.raises(ValueError, match=r"folds must name each fold once .*got \[0, 0\]"):
        ocr.run(data, [0, 0], ["2gram"])                  # fold 0 trained and counted twice in the means
    with pytest.raises(ValueError, match="device must name a device such as 'cpu' or 'cuda', got 'gpu'"):
        ocr.run(data, [0], ["2gram"], device="gpu")
    # a dict of settings was an AttributeError on 'seed' (and an empty one silently the defaults)
    for config in ({"crf_iter": 1}, {}):
        with pytest.raises(TypeError, match="config must be an OCRConfig or None, got dict"):
            ocr.run(data, [0], ["2gram"], config=config)
        with pytest.raises(TypeError, match="config must be an OCRConfig or None, got dict"):
            ocr.run_fold(data, 0, ["2gram"], config=config)
    # a bare fold number was "'int' object is not iterable", a str fold an AttributeError on a bool, and
    # True (== 1) was taken for fold 1
    with pytest.raises(TypeError, match=r"folds must be a sequence of fold numbers .*got int 0"):
        ocr.run(data, 0, ["2gram"])
    for folds, name in (([True], r"folds\[0\]"), ([0, 1.0], r"folds\[1\]")):
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            ocr.check_folds(data, folds)
    for fold in ("0", 0.0):
        with pytest.raises(TypeError, match="fold must be an int"):
            ocr.run_fold(data, fold, rows=["2gram"])


@pytest.mark.parametrize("field, value, error", [
    ("bandwidth", 0.0, ValueError), ("bandwidth", -1.0, ValueError), ("crf_iter", 0, ValueError),
    ("epochs", 0, ValueError), ("word_batch", 0, ValueError), ("unigram_search", "x", ValueError),
    ("test_iters", (1.5,), ValueError), ("test_iters", 5, ValueError), ("test_iters", (1, 1), ValueError),
    ("word_lr", float("nan"), ValueError), ("word_average", 1, TypeError), ("crf_l2", -1.0, ValueError),
])
def test_every_config_field_is_checked_at_construction(field, value, error):
    with pytest.raises(error, match=field):
        ocr.OCRConfig(**{field: value})


def test_config_keeps_numpy_and_tensor_scalars_as_python_numbers():
    """OCRConfig(seed=np.int64(0)) was kept as np.int64: run()'s "JSON-ready" results failed json.dumps."""
    config = ocr.OCRConfig(seed=np.int64(3), crf_iter=np.int32(5), word_lr=np.float32(0.5), psi_init=torch.tensor(2.0),
                           bandwidth=np.float64(1.5), word_average=np.bool_(False), test_iters=[1, 2])
    settings = asdict(config)
    assert json.loads(json.dumps(settings)) == {**settings, "test_iters": [1, 2]}
    assert type(config.seed) is int and type(config.word_lr) is float and config.word_average is False
    assert config.test_iters == (1, 2) and config.word_lr == 0.5 and config.psi_init == 2.0


def test_mean_map_of_integer_pixels_is_that_of_the_same_pixels_as_floats():
    from betheproj.learning import MeanMapPsi

    psi = MeanMapPsi(4, 50, bandwidth=3.0, seed=0)
    torch.nn.init.normal_(psi.linear.weight, generator=torch.Generator().manual_seed(1))
    pixels, lengths = torch.randint(0, 2, (2, 3, 4), generator=torch.Generator().manual_seed(2)), torch.tensor([3, 2])
    assert torch.allclose(psi(pixels, lengths), psi(pixels.float(), lengths))
    for bad in (torch.tensor([5, 2]), torch.tensor([0, 2])):
        with pytest.raises(ValueError, match=r"lengths must lie in \[1, N\]=\[1, 3\]"):
            psi(pixels.float(), bad)
    with pytest.raises(ValueError, match="init must be finite"):
        MeanMapPsi(4, 50, init=float("nan"))


@needs_data
def test_one_fold_subset_of_the_real_data():
    """Test fold 0 whole, training on 1,500 words of the other folds (seeded).  Measured on three such subsets
    (seeds 0, 1, 2): 2-gram 83.26 / 84.04 / 83.45 %, L^w 99.33 / 99.22 / 99.29 % (with the mean of Algorithm 3's
    iterates; 99.31 / 99.16 / 99.29 with the last one).  The thresholds leave over a point of room below the lowest,
    and L^w must beat the base by 10 points (measured: about 15)."""
    data = load_ocr(DATA)
    gen = torch.Generator().manual_seed(0)
    others = torch.nonzero(data.folds != 0).flatten()
    keep = torch.zeros(len(data), dtype=torch.bool)
    keep[data.folds == 0] = True
    keep[others[torch.randperm(len(others), generator=gen)[:1500]]] = True
    result = ocr.run_fold(data.subset(keep), 0, rows=["2gram", "Lw"])
    assert result.accuracy["2gram"] > 82.0
    assert result.accuracy["Lw"] > 98.0
    assert result.accuracy["Lw"] > result.accuracy["2gram"] + 10
