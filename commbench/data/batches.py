"""A worker's batches (`--data`): the fixed synthetic batch; the worker's shard of a
learnable task, its stream of the generated language (commbench.data.language) or its
windows of real text (commbench.data.text), built once before the clock starts and
served on the device in a seeded order, reshuffled at each pass, so that reading data is
never what a run measures; or its shard of a real dataset from a local path
(commbench.data.local), read by a DataLoader. Every worker takes the same number of
steps per epoch: an epoch is the training samples over the workers' total batch,
whatever the partition's shard sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

from commbench.config.flags import flag, one_of
from commbench.config.sections import Section
from commbench.data import local
from commbench.data import partition as partitions
from commbench.data.language import BYTES, MarkovLanguage
from commbench.data.learnable import LearnableTask
from commbench.data.local import LocalDataset
from commbench.data.text import TextCorpus
from commbench.errors import UsageError

FORMS = ("synthetic, learnable[:classes=N,noise=X,samples=N], "
         "language[:vocab=V,order=K,branch=B,samples=N], text:PATH, cifar10:PATH, "
         "imagefolder:PATH")
# Seeds drawn from --seed: the task (its prototypes), its training and validation samples
# and the partition; shifted so that none equals another.
TASK, TRAIN, VALIDATION, PARTITION = 0, 1, 2, 3


@dataclass(frozen=True)
class DataFlags(Section):
    title = "the data"

    data: str = flag("synthetic", "what to train on: synthetic (one fixed random batch, for "
                     "speed), learnable[:classes=N,noise=X,samples=N] (a classification "
                     "task generated from --seed), language[:vocab=V,order=K,branch=B,"
                     "samples=N] (a language model's: a Markov source from --seed, its "
                     "entropy rate the floor of the loss), text:PATH (a language model's: a UTF-8 "
                     "file or folder, read as bytes), cifar10:PATH or imagefolder:PATH "
                     "(read from disk, never downloaded)", metavar="SPEC")
    augment: str = flag("auto", "a dataset's training augmentation: auto (CIFAR-10 and "
                        "images of at most 64 px: a padded random crop and a flip; larger "
                        "images: ImageNet's random-resized crop and a flip), crop-flip, "
                        "resized-crop or none", one_of(local.AUGMENTS), "KIND")
    partition: str = flag("iid", "how a dataset's training samples are split among the "
                          "workers: iid, dirichlet:ALPHA (label skew) or, for --data "
                          "text:PATH, files (each worker its own files)", metavar="SPEC")

    @classmethod
    def unread(cls, config) -> Dict[str, str]:
        moot = {}
        if config.data.startswith("language"):
            moot["partition"] = ("the generated language gives each worker its own stream "
                                 "from one source (IID); it has no documents or labels to "
                                 "split by: leave --partition out")
        if config.data == "synthetic":
            moot["partition"] = ("the synthetic batch is one fixed batch, not a dataset to "
                                 "split among workers; give --data learnable, cifar10:PATH "
                                 "or imagefolder:PATH, or leave --partition out")
        kind = config.data.split(":")[0]
        if kind in ("synthetic", "learnable", "language", "text"):
            moot["augment"] = ("augments the images of a dataset read from disk (--data "
                               "cifar10:PATH or imagefolder:PATH); "
                               f"{'text' if kind == 'text' else 'generated data'} has none "
                               "to augment: leave it out")
        return moot


Task = Union[LearnableTask, MarkovLanguage, LocalDataset, TextCorpus]


def parse(spec: str, seed: int, augment: str = "auto") -> Optional[Task]:
    """None for the synthetic batch; the task of `learnable[:knobs]`; the source of
    `language[:knobs]`; the text of `text:PATH`; the dataset of `cifar10:PATH` or
    `imagefolder:PATH` (its training images augmented by augment)."""
    kind, _, knobs = spec.partition(":")
    if kind == "synthetic" and not knobs:
        return None
    if kind == "learnable":
        return LearnableTask.parse(knobs, seed + TASK)
    if kind == "language":
        return MarkovLanguage.parse(knobs, seed + TASK)
    if kind == "text":
        return TextCorpus.parse(knobs)
    if kind in local.KINDS:
        return LocalDataset.parse(kind, knobs, augment)
    raise UsageError(f"argument --data: {spec!r} is not one of {FORMS}")


@dataclass
class Batches:
    """next() -> (images, labels) on the device; facts: what the result records; task:
    what they are drawn from (None for the synthetic batch), whose validation set
    evaluation reads."""

    next: Callable[[], Tuple[Any, Any]]
    classes: int
    facts: Dict[str, Any]
    task: Optional[Task] = None


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, device,
                    seed: int) -> Tuple[Any, Any]:
    """One batch of random images and labels, generated once on the device (as Horovod's
    and Bluefog's synthetic benchmarks do), so that the input pipeline costs nothing."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
    labels = torch.randint(num_classes, (batch_size,), generator=generator)
    return images.to(device), labels.to(device)


def synthetic(batch_size: int, image_size: int, classes: int, device, seed: int) -> Batches:
    images, labels = synthetic_batch(batch_size, image_size, classes, device, seed=seed)
    return Batches(lambda: (images, labels), classes, {"data": "synthetic"})


def synthetic_tokens(batch_size: int, seq_len: int, vocab: int, device, seed: int
                     ) -> Batches:
    """A language model's synthetic batch: random token ids, generated once on the
    device as the synthetic images are. The labels are each position's next token,
    flattened as the model's logits per token are (language_models.logits_per_token)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (batch_size, seq_len + 1), generator=generator)
    inputs, labels = ids[:, :-1].contiguous().to(device), ids[:, 1:].reshape(-1).to(device)
    return Batches(lambda: (inputs, labels), vocab, {"data": "synthetic tokens"})


def learnable(task: LearnableTask, partition: str, batch_size: int, image_size: int,
              rank: int, world_size: int, device, seed: int) -> Batches:
    _, labels = task.draw(task.samples, image_size, seed + TRAIN, indices=[])
    shards = partitions.partition(labels, world_size, partition, seed + PARTITION)
    images, mine = task.draw(task.samples, image_size, seed + TRAIN, indices=shards[rank])
    images, mine = images.to(device), labels[shards[rank]].to(device)
    taken = shuffled(len(mine), batch_size, device, seed + PARTITION + 7919 * (rank + 1))
    mix = partitions.class_mix(labels, shards, task.classes)
    facts = {"data": task.describe(), "partition": partition, "class_mix": mix,
             "steps_per_epoch": max(1, task.samples // (batch_size * world_size))}

    def next_batch():
        chosen = taken()
        return images[chosen], mine[chosen]

    return Batches(next_batch, task.classes, facts, task)


def language(source: MarkovLanguage, batch_size: int, seq_len: int, rank: int,
             world_size: int, device, seed: int) -> Batches:
    """This worker's stream of the generated language: its share of an epoch's
    sequences, drawn from a seed of its own (IID: every worker's from the same source),
    built once before the clock starts and served as the learnable task's samples are.
    The labels are each position's next token, flattened as synthetic_tokens' are."""
    worker_seed = seed + TRAIN + 7919 * (rank + 1)
    ids = source.draw(max(batch_size, source.samples // world_size), seq_len + 1,
                      worker_seed)
    facts = {"data": source.describe(), "partition": "iid",
             "entropy_rate": source.entropy_rate,
             "steps_per_epoch": max(1, source.samples // (batch_size * world_size))}
    return Batches(token_windows(ids, batch_size, device, seed, rank), source.vocab, facts,
                   source)


def text(corpus: TextCorpus, partition: str, batch_size: int, seq_len: int, rank: int,
         world_size: int, device, seed: int) -> Batches:
    """This worker's windows of real text under the partition (commbench.data.text),
    served as the generated language's sequences are. An epoch is every worker's
    windows once over the workers' total batch."""
    shards = text_shards(corpus, seq_len, partition, world_size, seed)
    sequences = sum(len(ids) for _, ids in shards)
    facts = {"data": corpus.describe(), "partition": partition, "bytes": corpus.size,
             "files": len(corpus.names),
             "shards": [{"files": len(files), "sequences": len(ids)} for files, ids in shards],
             "steps_per_epoch": max(1, sequences // (batch_size * world_size))}
    return Batches(token_windows(shards[rank][1], batch_size, device, seed, rank),
                   BYTES, facts, corpus)


def text_shards(corpus: TextCorpus, seq_len: int, partition: str, world_size: int,
                seed: int):
    """Every worker's (files, windows) of the text: the same on every rank."""
    return corpus.shards(seq_len + 1, world_size, partition, seed + PARTITION)


def token_windows(ids, batch_size: int, device, seed: int, rank: int) -> Callable[[], Any]:
    """next() -> (inputs, labels) of a worker's windows of seq_len + 1 tokens, in a
    seeded order of its own: the labels each position's next token, flattened as
    synthetic_tokens' are."""
    ids = ids.to(device)
    taken = shuffled(len(ids), batch_size, device, seed + PARTITION + 7919 * (rank + 1))

    def next_batch():
        batch = ids[taken()].long()  # text is held as bytes
        return batch[:, :-1].contiguous(), batch[:, 1:].reshape(-1)

    return next_batch


def shuffled(count: int, batch_size: int, device, seed: int) -> Callable[[], Any]:
    """next() -> the indices of the next batch of `count` samples, on the device: a
    pass over them in a seeded order, then a new pass in a new order."""
    import torch

    order = torch.Generator().manual_seed(seed)
    state = {"queue": torch.empty(0, dtype=torch.int64)}

    def next_indices():
        queue = state["queue"]
        while len(queue) < batch_size:
            queue = torch.cat([queue, torch.randperm(count, generator=order)])
        state["queue"] = queue[batch_size:]
        return queue[:batch_size].to(device)

    return next_indices


def from_path(found: LocalDataset, partition: str, batch_size: int, image_size: int,
              rank: int, world_size: int, device, seed: int) -> Batches:
    """This worker's shard of a dataset on disk, read by a DataLoader."""
    train = found.dataset(image_size, train=True)
    labels = local.labels_of(train)
    classes = len(train.classes)
    shards = partitions.partition(labels, world_size, partition, seed + PARTITION)
    if min(len(s) for s in shards) < batch_size:
        raise UsageError(f"argument --data: a worker's shard of {found.describe()} holds "
                         f"fewer than --batch-size {batch_size} images")
    batches = local.loader(train, shards[rank], batch_size, device,
                           seed + PARTITION + 7919 * (rank + 1))
    mix = partitions.class_mix(labels, shards, classes)
    facts = {"data": found.describe(), "augment": found.augmentation(image_size),
             "partition": partition, "class_mix": mix,
             "steps_per_epoch": max(1, len(labels) // (batch_size * world_size))}
    return Batches(lambda: next(batches), classes, facts, found)


def validation(task: Task, image_size: int, seed: int, device="cpu",
               seq_len: int = 0) -> Tuple[Any, Any]:
    """The held-out validation set, the same on every worker: a learnable task's is a
    tenth of its training samples drawn from a seed of its own, and so is the generated
    language's, up to 256 sequences of seq_len tokens (with their next tokens); text's
    is the last tenth of each file (commbench.data.text); a dataset's is its test split
    (CIFAR-10) or its val folder."""
    if isinstance(task, LocalDataset):
        return local.in_memory(task.dataset(image_size, train=False), device)
    if isinstance(task, (MarkovLanguage, TextCorpus)):
        ids = task.draw(task.validation_samples, seq_len + 1, seed + VALIDATION) \
            if isinstance(task, MarkovLanguage) else \
            task.validation(seq_len + 1, seed + VALIDATION).long()
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    return task.draw(max(1, task.samples // 10), image_size, seed + VALIDATION)
