"""Helpers the loader's emulated-storage tests share (test_loader_access, test_loader_fidelity).

A small raw token dataset (16-token samples, so a batch's bytes are nothing beside the
emulated latency) and the quiet single-worker LoadConfig those tests start from.
"""

from __future__ import annotations

from iobench.generate import GenSpec, generate
from iobench.loader.core import LoadConfig


def tokens_dataset(tmp_path_factory, name: str, samples: int, shard_samples: int) -> str:
    """A raw token dataset of ``samples`` 16-token samples in ``shard_samples``-sample shards; its URL."""
    url = str(tmp_path_factory.mktemp(name) / "tok")
    generate(GenSpec(format="raw", modality="tokens", num_samples=samples, shard_size=f"{shard_samples} samples",
                     seq_len=16, vocab_size=1000, fsync=False), url, progress=False)
    return url


def quiet_cfg(url: str, batch_size: int, **kw) -> LoadConfig:
    """One worker, no shuffle buffer, a slow system monitor; ``kw`` overrides any of it."""
    base = dict(dataset=url, workers=1, batch_size=batch_size, shuffle_buffer=0, monitor_interval_s=1.0)
    return LoadConfig(**(base | kw))
