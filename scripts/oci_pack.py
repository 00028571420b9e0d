#!/usr/bin/env python3
"""Packs root file system directories as container images, without a daemon or registry.

Usage: oci_pack.py --name NAME --tag TAG --out-oci DIR --out-docker FILE
                   [--env K=V]... [--workdir DIR] [--user USER] [--cmd JSON]
                   [--whiteout PATH]... LAYER_DIR [LAYER_DIR...]

Each LAYER_DIR becomes one layer (in order, lowest first). --whiteout PATH adds a last
layer holding an OCI whiteout (`.wh.NAME`) for PATH. Writes:
  - an OCI image layout directory (gzip layers, `oci-layout`, `index.json`, blobs/sha256/),
  - a docker-archive tar in `docker save` format (manifest.json, config, LAYER/layer.tar),
both describing the same image (same config, so the same image id).

Layer tars are deterministic: sorted entries, numeric owner 0:0, file modes and mtimes kept
(CPython's .pyc files check their source's mtime), no device nodes.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile


def layer_tar(root, whiteouts=()):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(path, arc):
            info = tar.gettarinfo(path, arcname=arc)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.ischr() or info.isblk():
                return
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)

        if root:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                rel = os.path.relpath(dirpath, root)
                if rel != ".":
                    add(dirpath, rel)
                for name in sorted(filenames):
                    add(os.path.join(dirpath, name), os.path.normpath(os.path.join(rel, name)))
                # Symlinks to directories are listed in dirnames but not walked.
                for name in list(dirnames):
                    full = os.path.join(dirpath, name)
                    if os.path.islink(full):
                        add(full, os.path.normpath(os.path.join(rel, name)))
                        dirnames.remove(name)
        for path in whiteouts:
            path = path.strip("/")
            parent, name = os.path.split(path)
            info = tarfile.TarInfo(os.path.join(parent, ".wh." + name) if parent else ".wh." + name)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(b""))
    return buf.getvalue()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--tag", default="1")
    p.add_argument("--out-oci", required=True)
    p.add_argument("--out-docker", required=True)
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="")
    p.add_argument("--user", default="")
    p.add_argument("--cmd", default="")
    p.add_argument("--whiteout", action="append", default=[])
    p.add_argument("layers", nargs="+")
    a = p.parse_args()

    tars = [layer_tar(d) for d in a.layers]
    if a.whiteout:
        tars.append(layer_tar(None, a.whiteout))
    diff_ids = ["sha256:" + sha(t) for t in tars]
    config_obj = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2024-01-01T00:00:00Z",
        "config": {"Env": a.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "strata scripts/oci_pack.py"}
                    for _ in tars],
    }
    if a.workdir:
        config_obj["config"]["WorkingDir"] = a.workdir
    if a.user:
        config_obj["config"]["User"] = a.user
    if a.cmd:
        config_obj["config"]["Cmd"] = json.loads(a.cmd)
    config = json.dumps(config_obj, sort_keys=True, separators=(",", ":")).encode()
    config_digest = sha(config)
    ref = f"{a.name}:{a.tag}"

    # OCI layout (gzip-compressed layers).
    tmp_oci = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(a.out_oci)) or ".")
    blobs = os.path.join(tmp_oci, "blobs", "sha256")
    os.makedirs(blobs)

    def blob(data):
        digest = sha(data)
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return digest

    layers = []
    for t in tars:
        gz = gzip.compress(t, compresslevel=6, mtime=0)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": "sha256:" + blob(gz), "size": len(gz)})
    blob(config)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + config_digest, "size": len(config)},
        "layers": layers,
    }, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = blob(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": "sha256:" + manifest_digest, "size": len(manifest),
                       "annotations": {"org.opencontainers.image.ref.name": a.tag,
                                       "io.containerd.image.name": ref}}],
    }
    with open(os.path.join(tmp_oci, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True)
    with open(os.path.join(tmp_oci, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    if os.path.exists(a.out_oci):
        shutil.rmtree(a.out_oci)
    os.chmod(tmp_oci, 0o755)
    os.rename(tmp_oci, a.out_oci)

    # docker-archive (`docker save` format, uncompressed layers).
    tmp_docker = a.out_docker + ".tmp"
    with tarfile.open(tmp_docker, "w", format=tarfile.PAX_FORMAT) as out:
        def put(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))

        names = []
        for t in tars:
            d = sha(t)
            put(f"{d}/layer.tar", t)
            put(f"{d}/VERSION", b"1.0")
            names.append(f"{d}/layer.tar")
        put(f"{config_digest}.json", config)
        put("manifest.json", json.dumps([{"Config": f"{config_digest}.json",
                                          "RepoTags": [ref], "Layers": names}]).encode())
        put("repositories", json.dumps({a.name: {a.tag: config_digest}}).encode())
    os.replace(tmp_docker, a.out_docker)
    print(f"{ref} sha256:{config_digest} ({len(tars)} layers)")


if __name__ == "__main__":
    main()
