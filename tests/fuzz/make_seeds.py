#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py — writes the fuzz harnesses' seed corpora from the checkpoint test corpus.

The checkpoint corpus (tests/checkpoint/corpus: real saves of the tests' models and their
hand-made mutants) is the best start a fuzzer can have: every base and mutant manifest seeds
fuzz_manifest, every shard file seeds fuzz_safetensors, and every checkpoint directory, packed
as fuzz_checkpoint_dir reads it, seeds that harness. Seeds are named by their SHA-1 (libFuzzer's
own naming), so rerunning this script after the corpus changes only adds and removes files.

    python3 tests/fuzz/make_seeds.py   # rewrites tests/fuzz/corpus/{manifest,safetensors,checkpoint_dir}
"""
import hashlib
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parent / "checkpoint" / "corpus"
OUT = HERE / "corpus"


def pack_dir(directory):
    """The files of `directory` as [u32 name length][name][u32 data length][data] records."""
    out = b""
    for path in sorted(directory.iterdir()):
        if path.is_file():
            name, data = path.name.encode(), path.read_bytes()
            out += struct.pack("<I", len(name)) + name + struct.pack("<I", len(data)) + data
    return out


def write_seeds(kind, seeds):
    folder = OUT / kind
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {hashlib.sha1(s).hexdigest(): s for s in seeds}
    for old in folder.iterdir():
        if old.name not in wanted:
            old.unlink()
    for name, data in sorted(wanted.items()):
        (folder / name).write_bytes(data)
    print(f"{kind}: {len(wanted)} seeds, {sum(len(s) for s in wanted.values())} bytes")


def main():
    directories = sorted(p for p in SOURCE.iterdir() if p.is_dir() and p.name.startswith("base-"))
    directories += sorted(p for p in (SOURCE / "mutants").iterdir() if p.is_dir())
    manifests, shards, packed = [], [], []
    for d in directories:
        for f in sorted(d.iterdir()):
            if f.name == "manifest.json":
                manifests.append(f.read_bytes())
            elif f.name.endswith(".safetensors"):
                shards.append(f.read_bytes())
        packed.append(pack_dir(d))
    write_seeds("manifest", manifests)
    write_seeds("safetensors", shards)
    write_seeds("checkpoint_dir", packed)


if __name__ == "__main__":
    main()
