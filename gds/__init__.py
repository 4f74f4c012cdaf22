"""GPU-direct read paths (cuFile via KvikIO, compat, bounce, CPU) with honest path detection."""
