"""Offline stand-ins for the downloads in Composer 0.32.1's examples, for
``tools/composer_examples.py``: each example's script starts with ``install()``, which replaces

- ``torchvision.datasets.CIFAR10`` / ``MNIST`` by :class:`TinyImages` (random PIL images of
  CIFAR's 32x32 RGB or MNIST's 28x28 grey shape, 10 classes; :data:`TRAIN_SIZE` /
  :data:`TEST_SIZE` samples; ``download`` ignored);
- ``transformers.AutoTokenizer.from_pretrained`` by BERT's uncased WordPiece (MiniLM's, from
  ``cadence.data.sentiment``), whatever the name;
- ``transformers.AutoConfig.from_pretrained`` and
  ``AutoModelForSequenceClassification.from_pretrained`` by a 2-layer, 64-wide config of the
  named family (ELECTRA or BERT) and a randomly initialised model built from it;
- ``datasets.load_dataset('glue', 'sst2')`` / ``('ag_news')`` by :data:`TEXT_SIZE` random
  sentences per split with the real columns.

The point is to exercise cadence's API, not the data: accuracies are meaningless.
"""

from __future__ import annotations

import random
from typing import Any

TRAIN_SIZE = 256  #: samples in a stand-in image train split
TEST_SIZE = 128  #: samples in a stand-in image test split
TEXT_SIZE = 64  #: rows in each split of a stand-in text data set


class TinyImages:
    """A torchvision-style image classification data set of random images.

    Args:
        root: ignored (nothing is read or written).
        train: :data:`TRAIN_SIZE` samples when true, else :data:`TEST_SIZE`.
        transform: applied to each PIL image, as torchvision does.
        target_transform: applied to each int label.
        download: ignored.
    """

    shape: tuple[int, ...] = (32, 32, 3)
    classes = [str(i) for i in range(10)]

    def __init__(self, root: Any = None, train: bool = True, transform: Any = None,
                 target_transform: Any = None, download: bool = False) -> None:
        import numpy as np

        n = TRAIN_SIZE if train else TEST_SIZE
        rng = np.random.default_rng(0 if train else 1)
        self.data = rng.integers(0, 256, size=(n, *self.shape), dtype=np.uint8)
        self.targets = [int(t) for t in rng.integers(0, 10, size=n)]
        self.transform, self.target_transform = transform, target_transform
        self.train, self.root = train, root

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from PIL import Image

        array = self.data[index]
        image = Image.fromarray(array if array.shape[-1] == 3 else array[..., 0], mode=None)
        target = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class TinyCIFAR10(TinyImages):
    """CIFAR-10's shape: 32x32 RGB."""
    shape = (32, 32, 3)


class TinyMNIST(TinyImages):
    """MNIST's shape: 28x28 grey."""
    shape = (28, 28, 1)


def _tiny_config(name: str, **kwargs: Any) -> Any:
    import transformers

    size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                vocab_size=30522, max_position_embeddings=512)
    if "electra" in name.lower():
        return transformers.ElectraConfig(embedding_size=64, **size, **kwargs)
    return transformers.BertConfig(**size, **kwargs)


def _tokenizer(*args: Any, **kwargs: Any) -> Any:
    import transformers

    from cadence.data.sentiment import minilm_dir

    return transformers.BertTokenizerFast.from_pretrained(minilm_dir())


def _sequence_classifier(name: str, *args: Any, num_labels: int = 2, **kwargs: Any) -> Any:
    import transformers

    return transformers.AutoModelForSequenceClassification.from_config(
        _tiny_config(name, num_labels=num_labels))


def _load_dataset(path: str, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
    import datasets

    words = "the a film movie good bad great news sports world business science".split()
    rng = random.Random(0)

    def sentences() -> list[str]:
        return [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(TEXT_SIZE)]

    if path == "glue" and name == "sst2":
        split = lambda: datasets.Dataset.from_dict({  # noqa: E731
            "sentence": sentences(), "label": [rng.randint(0, 1) for _ in range(TEXT_SIZE)],
            "idx": list(range(TEXT_SIZE))})
        return datasets.DatasetDict(train=split(), validation=split(), test=split())
    if path == "ag_news":
        split = lambda: datasets.Dataset.from_dict({  # noqa: E731
            "text": sentences(), "label": [rng.randint(0, 3) for _ in range(TEXT_SIZE)]})
        return datasets.DatasetDict(train=split(), test=split())
    raise ValueError(f"no offline stand-in for the data set {path!r} {name!r}")


def _hub_only(original: Any, standin: Any) -> Any:
    """``standin`` for a Hub name, ``original`` for a local directory (a saved checkpoint's)."""
    import os

    def from_pretrained(name: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.isdir(str(name)):
            return original(name, *args, **kwargs)
        return standin(name, *args, **kwargs)

    return from_pretrained


def install() -> None:
    """Put the stand-ins in place (idempotent); a package that is not installed is skipped."""
    try:
        import torchvision.datasets as tv_datasets
    except ImportError:
        tv_datasets = None
    if tv_datasets is not None:
        tv_datasets.CIFAR10 = TinyCIFAR10
        tv_datasets.MNIST = TinyMNIST
    try:
        import transformers
    except ImportError:
        return
    for cls, standin in ((transformers.AutoTokenizer, _tokenizer),
                         (transformers.AutoConfig, lambda name, *a, **k: _tiny_config(name)),
                         (transformers.AutoModelForSequenceClassification, _sequence_classifier)):
        cls.from_pretrained = _hub_only(cls.from_pretrained, standin)
    try:
        import datasets
    except ImportError:
        return
    datasets.load_dataset = _load_dataset
