"""SIGKILL a saving process at every named point and at random times; restore must return the
newest committed checkpoint bit-exactly and never a partial one."""

from __future__ import annotations

import signal

import pytest

from iobench.checkpointing.crash import campaign
from iobench.checkpointing.hooks import POINTS


def _check(outs, n_named, min_trials=30, spread=True):
    assert len(outs) >= min_trials
    bad = [(o.trial.crash_at or o.trial.kill_after_s, o.violation) for o in outs if o.violation]
    assert not bad, bad
    named = outs[:n_named]
    # every injected point was reached (the saver died by SIGKILL there)
    assert all(o.signal == signal.SIGKILL for o in named), [(o.trial.crash_at, o.signal) for o in named]
    killed = sum(o.signal == signal.SIGKILL for o in outs)
    restored = {o.restored_step for o in outs}
    if spread:
        assert killed - n_named >= 0.3 * (len(outs) - n_named)   # random kills land inside the save sequence
        assert None in restored and len(restored - {None}) >= 2   # crashes before the first commit and after


def test_crash_at_every_point_and_random_times(tmp_path):
    outs = campaign(str(tmp_path), n_random=14, seed=1)
    _check(outs, 2 * len(POINTS))


@pytest.mark.slow
def test_crash_campaign_long(tmp_path):
    outs = campaign(str(tmp_path), n_random=300, seed=2)
    _check(outs, 2 * len(POINTS))


def test_crash_with_s3_durable_tier(tmp_path, s3_env, s3_prefix):
    points = ("mid_upload", "mid_manifest_publish", "mid_retention")
    outs = campaign(str(tmp_path), n_random=1, seed=3, points=points, nths=(2,), durable_root=s3_prefix,
                    random_window_s=0.5)
    _check(outs, len(points), min_trials=len(points) + 1, spread=False)
    assert all(o.restored_step for o in outs[:len(points)])     # step 1 was durable before each kill


@pytest.mark.slow
def test_crash_campaign_s3_long(tmp_path, s3_env, s3_prefix):
    outs = campaign(str(tmp_path), n_random=60, seed=4, durable_root=s3_prefix)
    _check(outs, 2 * len(POINTS))
