"""Real text (`--data text:PATH`): a file or folder read as bytes, cut into windows of
--seq-len + 1, the last tenth of each file held out; the iid and per-file partitions;
what cannot be trained on refused in one line; and two workers through mpiexec that
reach a target loss on generated English, and time a speed run on it."""

import random
from pathlib import Path
from unittest import mock

import pytest
import torch

from cli_helpers import refused
from commbench.config.run_config import RunConfig
from commbench.data import batches, text
from commbench.data.language import check_pairing
from commbench.data.text import TextCorpus
from commbench.errors import UsageError
from commbench.job import training_checks
from launchers import mpiexec, only_result

WORDS = ("the quick brown fox jumps over a lazy dog while the small cat sleeps near the "
         "warm fire and an old man reads his book").split()
LM = ("--model", "lm-tiny", "--seq-len", "16", "--batch-size", "4")


def english(folder: Path, files: int = 4, lines: int = 60, seed: int = 0) -> Path:
    """A folder of files of made-up English sentences (one in a subfolder)."""
    draw = random.Random(seed)
    for i in range(files):
        path = folder / ("deeper" if i == files - 1 else "") / f"doc{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(" ".join(draw.choice(WORDS) for _ in range(10)) + "."
                                  for _ in range(lines)))
    return folder


def test_a_folder_is_read_recursively_in_order_without_hidden_files(tmp_path):
    english(tmp_path, files=3)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_bytes(b"\0binary")
    (tmp_path / ".notes.swp").write_bytes(b"\xff")
    corpus = TextCorpus.parse(str(tmp_path))
    assert corpus.names == ("deeper/doc2.txt", "doc0.txt", "doc1.txt")
    assert corpus.texts[1] == (tmp_path / "doc0.txt").read_bytes()
    assert corpus.size == sum(len(t) for t in corpus.texts)
    assert TextCorpus.parse(str(tmp_path)) is corpus  # read once per path
    one = TextCorpus.parse(str(tmp_path / "doc1.txt"))
    assert one.names == ("doc1.txt",) and one.describe() == f"text:{tmp_path / 'doc1.txt'}"


def test_tokens_are_bytes_and_the_last_tenth_of_each_file_is_held_out(tmp_path):
    (tmp_path / "a.txt").write_text("é" * 50)  # 100 bytes: 90 to train on, 10 held out
    (tmp_path / "b.txt").write_text("abcdefghij" * 3)  # 30 bytes: 27 and 3
    corpus = TextCorpus.parse(str(tmp_path))
    train = corpus.training(9, [0, 1])
    assert train.dtype == torch.uint8 and train.shape == (13, 9)  # 117 bytes, cut in nines
    assert bytes(train.reshape(-1).tolist()) == ("é" * 45).encode() + b"abcdefghij" * 2 \
        + b"abcdefg"
    held_out = corpus.validation(13, seed=0)
    assert bytes(held_out.reshape(-1).tolist()) == ("é" * 5).encode() + b"hij"
    assert corpus.training(9, [1]).shape == (3, 9)


def test_the_validation_set_is_at_most_256_windows_chosen_by_the_seed(tmp_path):
    (tmp_path / "long.txt").write_text("".join(chr(97 + i % 26) for i in range(50000)))
    corpus = TextCorpus.parse(str(tmp_path))
    chosen = corpus.validation(17, seed=3)
    assert chosen.shape == (256, 17)  # of 5000 // 17 = 294 windows
    assert torch.equal(chosen, corpus.validation(17, seed=3))
    assert not torch.equal(chosen, corpus.validation(17, seed=4))
    inputs, labels = batches.validation(corpus, 0, 42, seq_len=16)
    assert inputs.dtype == torch.int64 and inputs.shape == labels.shape == (256, 16)
    assert torch.equal(inputs[:, 1:], labels[:, :-1])


def test_iid_interleaves_the_windows_and_files_gives_each_worker_its_own(tmp_path):
    corpus = TextCorpus.parse(str(english(tmp_path, files=5)))
    everything = corpus.training(17, list(range(5)))
    iid = corpus.shards(17, 2, "iid", seed=0)
    assert [files for files, _ in iid] == [[0, 1, 2, 3, 4]] * 2
    assert torch.equal(iid[1][1], everything[1::2])
    by_file = corpus.shards(17, 2, "files", seed=0)
    mine, theirs = (set(files) for files, _ in by_file)
    assert not mine & theirs and mine | theirs == set(range(5))
    assert torch.equal(by_file[0][1], corpus.training(17, sorted(mine)))
    assert [f for f, _ in corpus.shards(17, 2, "files", seed=0)] == [sorted(mine),
                                                                     sorted(theirs)]
    assert {tuple(corpus.shards(17, 2, "files", seed=s)[0][0]) for s in range(8)} != \
        {tuple(sorted(mine))}  # the seed deals the files


def test_a_workers_batches_are_its_windows_with_next_token_labels(tmp_path):
    corpus = TextCorpus.parse(str(english(tmp_path)))
    mine, theirs = (batches.text(corpus, "files", 4, 16, rank, 2, "cpu", seed=42)
                    for rank in (0, 1))
    inputs, labels = mine.next()
    assert inputs.dtype == torch.int64 and inputs.shape == (4, 16) and labels.shape == (64,)
    assert torch.equal(inputs[:, 1:], labels.view(4, 16)[:, :-1])
    assert not torch.equal(inputs, theirs.next()[0])
    sequences = [len(ids) for _, ids in corpus.shards(17, 2, "files", 42 + batches.PARTITION)]
    assert mine.classes == 256 and mine.task is corpus
    assert mine.facts == {"data": f"text:{tmp_path}", "partition": "files",
                          "bytes": corpus.size, "files": 4,
                          "shards": [{"files": 2, "sequences": n} for n in sequences],
                          "steps_per_epoch": sum(sequences) // 8}


@pytest.mark.parametrize("make, args, message", [
    (None, [], "argument --data: text:{p}/absent: no such file or folder"),
    (lambda p: (p / ".hidden").write_text("x"), [], "argument --data: text:{p}/corpus: no "
     "text files in the folder"),
    (lambda p: (p / "empty.txt").write_text(""), [], "argument --data: text:{p}/corpus: "
     "empty.txt is empty"),
    (lambda p: (p / "a.bin").write_bytes(b"abc\0def"), [], "argument --data: text:{p}/corpus:"
     " a.bin is binary, not text (a NUL byte at byte 3)"),
    (lambda p: (p / "latin.txt").write_bytes("café".encode("latin-1")), [],
     "argument --data: text:{p}/corpus: latin.txt is not UTF-8 text (byte 3: 0xe9)"),
    (lambda p: (p / "short.txt").write_text("too short"), [], "argument --data: "
     "text:{p}/corpus's training text makes 0 sequences of 17 bytes (--seq-len + 1), fewer "
     "than the 1 workers"),
    (lambda p: (p / "a.txt").write_text("x" * 160), ["--target-loss", "2"], "argument --data: "
     "text:{p}/corpus: its held-out text (the last tenth of each file, 16 bytes or so) is "
     "shorter than one sequence of 17 bytes"),
    (lambda p: english(p), ["--partition", "dirichlet:0.5"], "argument --partition: "
     "dirichlet:0.5 skews the labels of a dataset; text:{p}/corpus has none: give iid or "
     "files"),
    (lambda p: english(p), ["--augment", "none"], "argument --augment: augments the images "
     "of a dataset read from disk (--data cifar10:PATH or imagefolder:PATH); text has none"),
])
def test_what_cannot_be_trained_on_is_refused_in_one_line(tmp_path, make, args, message):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    if make is not None:
        make(corpus)
    path = corpus if make is not None else tmp_path / "absent"
    assert message.format(p=tmp_path) in refused(*LM, "--data", f"text:{path}", *args)


def test_more_text_than_a_run_reads_into_memory_is_refused(tmp_path):
    english(tmp_path)
    (tmp_path / "big.txt").write_text("a" * (1 << 20))
    size = sum(p.stat().st_size for p in tmp_path.rglob("*.txt"))
    with mock.patch.object(text, "MAX_BYTES", 1 << 20):
        line = refused(*LM, "--data", f"text:{tmp_path}")
    assert line.endswith(f"argument --data: text:{tmp_path} holds {size} bytes, "
                         "more than the 1 MiB a run reads into memory: point it at a part")


def test_files_needs_a_file_per_worker_and_text_data(tmp_path):
    english(tmp_path, files=2)
    two = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with mock.patch.dict("os.environ", two):
        line = refused(*LM, "--data", f"text:{tmp_path}", "--partition", "files")
    assert line.endswith(f"argument --partition: files gives each worker its own files; "
                         f"text:{tmp_path} holds 2, fewer than the 3 workers: give more "
                         "files, or --partition iid")
    assert "argument --partition: files gives each worker its own files of --data " \
           "text:PATH, not of learnable" in refused("--model", "resnet18", "--data",
                                                    "learnable", "--partition", "files")


def test_text_is_a_language_models_data_whose_vocabulary_holds_a_byte(tmp_path):
    english(tmp_path)
    assert "argument --data: text needs a path: text:PATH" in refused(*LM, "--data", "text")
    assert "argument --data: text is a language model's data (tokens); resnet18 is an " \
           "image model" in refused("--model", "resnet18", "--data", f"text:{tmp_path}")
    with pytest.raises(UsageError, match="text's vocab=256 is more than tiny's vocabulary "
                                         "of 128 tokens"):
        check_pairing(f"text:{tmp_path}", "tiny", 128, seed=0)
    check_pairing(f"text:{tmp_path}", "lm-tiny", 256, seed=0)


def test_real_text_has_no_floor_to_check_a_target_loss_against(tmp_path):
    english(tmp_path)
    training_checks.check(RunConfig(model="lm-tiny", data=f"text:{tmp_path}",
                                    target_loss=0.001))


def two_workers(tmp_path: Path, *args: str):
    """(the mpiexec, its result) of `allreduce` on two workers and generated English."""
    corpus = english(tmp_path / "corpus")
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer", "allreduce", *LM, "--data",
                       f"text:{corpus}", *args, "--results-dir", str(tmp_path / "results")],
                   timeout=280, env={"OMP_NUM_THREADS": "1"})  # a thread per rank: 2 cores
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done, only_result(tmp_path / "results")


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_two_workers_on_their_own_files_reach_a_target_loss(tmp_path):
    done, doc = two_workers(tmp_path, "--partition", "files", "--target-loss", "2.5",
                            "--eval-every", "10", "--max-epochs", "3")
    summary = doc["summary"]
    assert summary["reached"] is True and summary["best_loss"] <= 2.5
    assert summary["unit"] == "tokens" and summary["target_loss"] == 2.5
    assert (doc["config"]["partition"], doc["data"]["partition"]) == ("files", "files")
    assert [s["files"] for s in doc["data"]["shards"]] == [2, 2]
    assert "entropy_rate" not in doc["data"]
    assert done.stdout.count("; floor of the loss unknown (real text)") == 1
    assert "Model: lm-tiny (sequences of 16 byte-level text tokens)" in done.stdout


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_speed_run_on_text_counts_tokens(tmp_path):
    done, doc = two_workers(tmp_path, "--num-warmup-batches", "1", "--num-iters", "2",
                            "--num-batches-per-iter", "2", "--reference-iters", "0")
    assert doc["summary"]["unit"] == "tokens" and doc["data"]["partition"] == "iid"
    assert [s["files"] for s in doc["data"]["shards"]] == [4, 4]
    assert "Total tokens/sec on 2 worker(s)" in done.stdout
