"""What a push or a pull reports (the fields both share, and their JSON form), and the pool of threads
both move a version's files on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class TransferResult:
    """One version moved between a local OUT and a remote one: the remote OUT's url, the version number,
    its files and bytes, its manifest, the versions pruned after the move (names, oldest first), the id
    of the key that signed it (None: unsigned, or not checked on an unsigned fleet), and, on a signed
    fleet, when its signed metadata expires (unix seconds) and the version it names as LATEST."""

    url: str
    version: int
    files: int
    bytes: int
    manifest: dict
    pruned: list[str] = field(default_factory=list)
    signed_by: str | None = None
    expires: float | None = None
    fleet_latest: int | None = None

    def as_dict(self) -> dict:
        """The JSON form (`--json`): every field but the manifest, plus the manifest's model_version."""
        return {k: v for k, v in self.__dict__.items() if k != "manifest"} | {
            "model_version": self.manifest.get("model_version")
        }


def for_each_on_threads(work: Callable[[str], None], names: list[str], threads: int) -> None:
    """work(name) for every name on a pool of `threads`; the first error is raised once the transfers
    already running have ended, and the names not started yet are cancelled (a bad first object does not
    move the rest of the bundle first)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        for future in [pool.submit(work, name) for name in names]:
            future.result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
