"""`iobench index DATASET_URL [--format FORMAT]`: bring your own dataset (format detected from the files)."""

from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag, add_storage_option_flag

    p = sub.add_parser("index", help="scan an existing dataset (webdataset tars, Parquet, TFRecord, npz, npy, "
                                     "Megatron .bin/.idx, HDF5, HF save_to_disk Arrow, files) and write an "
                                     "iobench manifest for it",
                       description="Scan a dataset iobench did not write and write the manifest that `load`, "
                                   "`verify --no-checksums` and `stage` read.  No data file is changed: the only "
                                   "output is the manifest, beside the data (DATASET_URL/manifest.json) or at --out.  "
                                   "Parquet reads only footers, TFRecords with a tfrecord-package .index read only "
                                   "the index, npy files only their headers, Megatron datasets only their .idx, HDF5 only its metadata, "
                                   "files are only listed; tars, npz and Arrow files are read once to count samples.  "
                                   "The format is detected from the files' suffixes unless --format names it.  "
                                   "DATASET_URL may also be one shard file or a brace range "
                                   "(train-{000000..000003}.tar): only those files are indexed.")
    p.add_argument("dataset", metavar="DATASET_URL", help="dataset root (local path, s3://bucket/prefix, any fsspec "
                                                        "URL), one shard file, or a brace range of shards")
    p.add_argument("--format", metavar="FORMAT", help="tar | parquet | tfrecord | files | npz | npy | megatron | "
                                                      "hdf5 | arrow (default: detected from the file suffixes)")
    p.add_argument("--modality", metavar="KIND", help="tokens | images | records (default: detected from the first file)")
    p.add_argument("--token-dtype", default="uint16", metavar="DTYPE", help="dtype of raw token arrays (uint16)")
    p.add_argument("--seq-len", type=int, default=0, metavar="N",
                   help="megatron: samples are GPTDataset's windows of N+1 tokens across documents (default: "
                        "one sample per sequence)")
    p.add_argument("--checksums", action="store_true", help="read every byte and record xxh64 checksums "
                                                            "(then plain `verify` checks them)")
    p.add_argument("--out", metavar="PATH", help="write the manifest here instead of DATASET_URL/manifest.json")
    p.add_argument("--force", action="store_true", help="replace an existing manifest at the destination")
    add_endpoint_flag(p)
    add_storage_option_flag(p)
    add_json_flag(p)
    guard.declare(p, guard.dataset("dataset", "DATASET_URL"),
                  guard.out_file("out", "--out", owner="manifest", inside_ok=("dataset",)))
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from ..errors import ConfigError
    from ..index import IndexOptions, index_dataset, resolve_dataset_url
    from ..manifest import MANIFEST_NAME, write_manifest
    from ..results import Results
    from ..storage import open_backend, parse_storage_options
    from ..units import format_bytes

    opts = IndexOptions(format=args.format, modality=args.modality, token_dtype=args.token_dtype,
                        checksums=args.checksums, seq_len=args.seq_len)
    so = parse_storage_options(args.storage_option)
    ref = resolve_dataset_url(args.dataset)
    backend = open_backend(ref.root, endpoint_url=args.endpoint_url, storage_options=so,
                           field_name="dataset", check=True)
    if args.out is None:
        dest, dest_rel = backend, MANIFEST_NAME
    else:
        import posixpath

        dest = open_backend(posixpath.dirname(args.out.rstrip("/")) or ".", endpoint_url=args.endpoint_url,
                            storage_options=so, field_name="--out")
        dest_rel = posixpath.basename(args.out.rstrip("/"))
    if dest.exists(dest_rel) and not args.force:
        raise ConfigError("--out" if args.out else "dataset", f"{dest.path(dest_rel)} exists",
                          "add --force to replace it, or give --out PATH")
    t0 = time.perf_counter()
    manifest = index_dataset(backend, opts, only=ref.only)
    seconds = time.perf_counter() - t0
    if args.out is None:
        write_manifest(backend, manifest)
    else:
        dest.write_bytes(dest_rel, manifest.to_json())
    where = dest.path(dest_rel) if dest.is_local else f"{dest.url.rstrip('/')}/{dest_rel}"
    if args.json:
        Results(command="index", config={"dataset": args.dataset, "format": manifest.format, "out": args.out,
                                         "checksums": args.checksums},
                metrics={"shards": len(manifest.shards), "samples": manifest.total_samples,
                         "bytes": manifest.total_bytes, "seconds": seconds,
                         "modality": manifest.modality}).write(args.json)
    print(f"indexed {manifest.total_samples} {manifest.modality} samples in {len(manifest.shards)} "
          f"{manifest.format} files ({format_bytes(manifest.total_bytes)}) -> {where}")
    if args.out:
        print("note: load/verify/stage read DATASET_URL/manifest.json; copy the manifest there to use it")
    elif not args.checksums:
        print(f"next: iobench load {ref.root}   (verify with --no-checksums, or index with --checksums)")
    return 0
