"""What both OpenAI Agents SDK sandbox sessions of :mod:`strata.openai_agents` share: the
manifest rules a Strata sandbox honours and workspace snapshots as tar streams."""

from __future__ import annotations

import abc
import asyncio
import io
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Optional, Set

from agents.sandbox.errors import WorkspaceArchiveReadError, WorkspaceArchiveWriteError
from agents.sandbox.manifest import Manifest
from agents.sandbox.materialization import MaterializationResult
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.util.tar_utils import safe_extract_tarfile, should_skip_tar_member

import strata


def check_manifest(manifest: Manifest) -> None:
    """Refuses what a Strata sandbox cannot honour."""
    if manifest.users or manifest.groups:
        raise ValueError(
            "StrataSandboxClient does not support manifest users or groups: every call runs "
            "as the sandbox's one user"
        )
    for grant in manifest.extra_path_grants:
        if grant.host_path is not None:
            raise ValueError(
                "StrataSandboxClient does not support the path grant host_path for "
                f"{grant.path!r}: "
                "give the client's caps a mount (read_only=[(host_path, path)]) instead"
            )


def tar_directory(directory: Path, skip: Set[Path]) -> io.IOBase:
    """An uncompressed tar of ``directory`` with workspace-relative member names."""
    buffer = io.BytesIO()

    def keep(member: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        if should_skip_tar_member(member.name, skip_rel_paths=skip, root_name=None):
            return None
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member

    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(str(directory), arcname=".", filter=keep)
    buffer.seek(0)
    return buffer


def extract_tar(data: io.IOBase, tree: Path) -> None:
    with tarfile.open(fileobj=data, mode="r:*") as tar:
        safe_extract_tarfile(tar, root=tree, allow_external_symlink_targets=False)


class StrataSessionBase(BaseSandboxSession):
    """The manifest checks and the snapshot (tar) side of a Strata-backed SDK session; a
    subclass copies its workspace out and in (:meth:`_download_workspace`,
    :meth:`_upload_workspace`)."""

    @abc.abstractmethod
    async def _download_workspace(self, host_dir: str) -> None:
        """Copies the workspace (``Manifest.root``) to ``host_dir`` on the host."""

    @abc.abstractmethod
    async def _upload_workspace(self, host_dir: str) -> None:
        """Copies the tree at ``host_dir`` into the workspace."""

    async def _validate_manifest_application(
        self,
        *,
        only_ephemeral: bool = False,
        manifest: Optional[Manifest] = None,
        session_running: Optional[bool] = None,
    ) -> None:
        await super()._validate_manifest_application(
            only_ephemeral=only_ephemeral, manifest=manifest, session_running=session_running
        )
        check_manifest(manifest or self.state.manifest)

    async def _apply_manifest(
        self,
        *,
        only_ephemeral: bool = False,
        provision_accounts: bool = True,
    ) -> MaterializationResult:
        check_manifest(self.state.manifest)
        return await super()._apply_manifest(
            only_ephemeral=only_ephemeral, provision_accounts=provision_accounts
        )

    async def provision_manifest_accounts(self) -> None:
        check_manifest(self.state.manifest)

    async def persist_workspace(self) -> io.IOBase:
        root = Path(self.state.manifest.root)
        skip = self._persist_workspace_skip_relpaths()
        scratch = Path(tempfile.mkdtemp(prefix="strata-persist-"))
        try:
            copy = scratch / "workspace"
            try:
                await self._download_workspace(str(copy))
            except strata.SandboxError as e:
                raise WorkspaceArchiveReadError(
                    path=root, context={"reason": str(e)}, cause=e
                ) from e
            return await asyncio.to_thread(tar_directory, copy, skip)
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = Path(self.state.manifest.root)
        scratch = Path(tempfile.mkdtemp(prefix="strata-hydrate-"))
        try:
            tree = scratch / "workspace"
            try:
                await asyncio.to_thread(extract_tar, data, tree)
            except (tarfile.TarError, OSError, ValueError) as e:
                raise WorkspaceArchiveWriteError(
                    path=root, context={"reason": str(e)}, cause=e
                ) from e
            try:
                await self._upload_workspace(str(tree))
            except strata.SandboxError as e:
                raise WorkspaceArchiveWriteError(
                    path=root, context={"reason": str(e)}, cause=e
                ) from e
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
