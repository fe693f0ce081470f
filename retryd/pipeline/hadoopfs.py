"""Files on any Hadoop-compatible store (``file://``, ``hdfs://``, ``s3a://`` ...) from the
driver, through the Hadoop ``FileSystem`` of the driver's JVM.

The archive must live wherever the cluster's Spark can write, and its checkpoint beside the
data, so its own bookkeeping (small JSON files, renames of the Parquet files Spark wrote) goes
through the same ``FileSystem`` Spark uses, resolved against the same Hadoop configuration: a
plain path means what it means to Spark (the default file system: local on ``local[*]``, HDFS
on most clusters).

Only operations every Hadoop file system provides are used. Small state files are written to a
temporary name and renamed to a name that was never used before, so on every store a reader
sees the whole file or no file (an object store's rename is a copy, but a copy of a complete
object appears at once).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retryd.errors import RetrydError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class StoreError(RetrydError):
    """A file system operation failed; the message names the URI."""


class HadoopFS:
    """A directory tree rooted at ``root`` (a URI or a path), addressed by relative names."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark._jvm
        if jvm is None:
            raise StoreError("the Spark session has no JVM (Spark Connect is not supported)")
        self._jvm: Any = jvm
        self._path_cls: Any = jvm.org.apache.hadoop.fs.Path
        conf = spark._jsc.hadoopConfiguration()
        try:
            raw = self._path_cls(root)
            self.fs: Any = raw.getFileSystem(conf)
            self._root: Any = self.fs.makeQualified(raw)
        except Exception as exc:  # py4j error: unknown scheme, missing connector ...
            raise StoreError(f"cannot open {root!r}: {_java_message(exc)}") from exc
        self.uri: str = str(self._root.toString())
        self.scheme: str = str(self._root.toUri().getScheme() or "file")

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def local_path(self, rel: str = "") -> Path:
        """The POSIX path of ``rel`` (local file systems only)."""
        if not self.is_local:
            raise StoreError(f"{self.uri} is not on the local file system")
        return Path(str(self._path(rel).toUri().getPath()))

    def _path(self, rel: str) -> Any:
        return self._root if not rel else self._path_cls(self._root, rel)

    def child_uri(self, rel: str) -> str:
        return str(self._path(rel).toString())

    def _call(self, what: str, rel: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            raise StoreError(f"{what} {self.child_uri(rel)}: {_java_message(exc)}") from exc

    def exists(self, rel: str) -> bool:
        return bool(self._call("exists", rel, self.fs.exists, self._path(rel)))

    def mkdirs(self, rel: str) -> None:
        self._call("mkdirs", rel, self.fs.mkdirs, self._path(rel))

    def delete(self, rel: str, recursive: bool = False) -> bool:
        """Remove a file (or a tree); False when there was nothing to remove."""
        return bool(self._call("delete", rel, self.fs.delete, self._path(rel), recursive))

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (whose parent is created). Fails if ``dst`` exists."""
        parent = dst.rpartition("/")[0]
        if parent:
            self.mkdirs(parent)
        done = self._call("rename", src, self.fs.rename, self._path(src), self._path(dst))
        if not done:
            raise StoreError(f"rename {self.child_uri(src)} -> {self.child_uri(dst)} refused")

    def glob(self, pattern: str) -> list[str]:
        """Relative names matching a Hadoop glob (``date=*/batch-3-*``), sorted."""
        statuses = self._call("glob", pattern, self.fs.globStatus, self._path(pattern))
        if statuses is None:
            return []
        root = self.uri.rstrip("/") + "/"
        out = []
        for status in statuses:
            full = str(status.getPath().toString())
            out.append(full[len(root) :] if full.startswith(root) else full)
        return sorted(out)

    def list_names(self, rel: str) -> list[str]:
        """Names directly inside directory ``rel`` ([] when it does not exist)."""
        if not self.exists(rel):
            return []
        statuses = self._call("list", rel, self.fs.listStatus, self._path(rel))
        return sorted(str(s.getPath().getName()) for s in statuses)

    def read_bytes(self, rel: str) -> bytes | None:
        """Content of a file, or None when it does not exist."""
        if not self.exists(rel):
            return None
        stream = self._call("open", rel, self.fs.open, self._path(rel))
        try:
            to_bytes = self._jvm.org.apache.commons.io.IOUtils.toByteArray
            data = self._call("read", rel, to_bytes, stream)
        finally:
            stream.close()
        return bytes(data)

    def write_new(self, rel: str, data: bytes) -> None:
        """Create ``rel`` with ``data`` as one step: a temporary file renamed into place.

        ``rel`` must not exist (state files are written once; callers pick fresh names).
        """
        tmp = f"{rel}.tmp-{uuid.uuid4().hex[:12]}"
        out = self._call("create", tmp, self.fs.create, self._path(tmp), False)
        try:
            self._call("write", tmp, out.write, bytearray(data))
            try:
                out.hsync()  # durable before the rename publishes it (HDFS, local)
            except Exception as exc:  # object stores may refuse: their close() is the commit
                log.debug("hsync of %s not supported: %s", self.child_uri(tmp), exc)
        finally:
            out.close()
        try:
            self.rename(tmp, rel)
        except StoreError:
            self.delete(tmp)
            raise

    def create_exclusive(self, rel: str, data: bytes) -> None:
        """Create ``rel`` only if it does not exist (atomic on HDFS; best effort on stores
        without conditional writes)."""
        out = self._call("create", rel, self.fs.create, self._path(rel), False)
        try:
            self._call("write", rel, out.write, bytearray(data))
        finally:
            out.close()

    def read_json(self, rel: str) -> Any:
        data = self.read_bytes(rel)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise StoreError(f"{self.child_uri(rel)} is not valid JSON: {exc}") from exc

    def write_json_new(self, rel: str, value: Any) -> None:
        self.write_new(rel, json.dumps(value, indent=1, sort_keys=True).encode("utf-8"))


def _java_message(exc: BaseException) -> str:
    """The Java exception's own message rather than a py4j stack trace."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return f"{java.getClass().getSimpleName()}: {java.getMessage()}"
        except Exception:  # the gateway may be gone
            pass
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
