"""Checkpoint engine: state sizing, snapshot, local write, async commit, commit point, restore, retention."""
