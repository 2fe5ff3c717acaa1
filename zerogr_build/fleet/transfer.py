"""What a push or a pull reports: the fields both share, and their JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class TransferResult:
    """One version moved between a local OUT and a remote one: the remote OUT's url, the version number,
    its files and bytes, its manifest, the versions pruned after the move (names, oldest first), and the
    id of the key that signed it (None: unsigned, or not checked on an unsigned fleet)."""

    url: str
    version: int
    files: int
    bytes: int
    manifest: dict
    pruned: list[str] = field(default_factory=list)
    signed_by: str | None = None

    def as_dict(self) -> dict:
        """The JSON form (`--json`): every field but the manifest, plus the manifest's model_version."""
        return {k: v for k, v in self.__dict__.items() if k != "manifest"} | {
            "model_version": self.manifest.get("model_version")
        }
