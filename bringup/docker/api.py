"""The docker daemon behind one typed facade: every use of the docker SDK goes through here.

    docker = Docker.connect()                      # DockerError (saying why) when no daemon answers
    docker.exists(ref), docker.image_id(ref), docker.image_env(ref), docker.pull(ref)
    for line in docker.build(context, dockerfile, tag, buildargs, network): ...
    docker.import_tarball(path, tag, changes)
    with docker.image_files(ref, argv) as files:       # one created container, removed at the end
        files.output(timeout); files.archive(path, fileobj)
    docker.labelled(label), docker.remove(container_id), docker.container_name(container_id)
    docker.version(), docker.runtimes()
    with docker.container(spec, keep=False) as box:    # created, attached, removed at the end
        box.start(); box.lines(); box.wait(timeout); box.stop(grace); box.commit(tag)

A :class:`Container` is a context manager with exact exit codes and guaranteed cleanup: it is
removed when the block ends, however it ends, unless ``keep``. Its stdin is attached to this
process and closed by docker when this process goes away (``StdinOnce``), so a stage can tell
that its owner died. The SDK is imported on first use only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

# Seconds one daemon request may take. Creating or removing a container of a multi-gigabyte image
# copies or deletes its whole root file system on storage drivers without layers (vfs), which a
# busy two-core host takes minutes to do; the SDK's default of 60 s fails such requests.
DAEMON_TIMEOUT_S = 900


def sdk_client() -> Any:
    """A docker SDK client for the daemon of the environment (DOCKER_HOST or the local socket),
    with :data:`DAEMON_TIMEOUT_S` per request."""
    import docker

    return docker.from_env(timeout=DAEMON_TIMEOUT_S)


class DockerError(Exception):
    """The daemon is missing, or refused a request; the message says which and why."""


class ContainerTimeout(Exception):
    """A container did not exit within the time it was given."""


@dataclass(frozen=True)
class ContainerSpec:
    """What a container runs and sees: the image, the command, its environment, working folder,
    bind mounts (host path -> read-only?), labels and GPUs (None, "all" or a count)."""

    image: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    mounts: dict[str, bool] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    gpus: str | int | None = None
    name: str | None = None


@dataclass(frozen=True)
class ContainerInfo:
    """A container as listed: id, name, status and labels."""

    id: str
    name: str
    status: str
    labels: dict[str, str]


class Docker:
    """A connection to the local daemon."""

    def __init__(self, client: Any):
        self._client = client

    @classmethod
    def connect(cls) -> "Docker":
        try:
            import docker  # noqa: F401 - only to tell a missing SDK from a missing daemon
        except ImportError:
            raise DockerError("the docker SDK for Python is not installed (pip install docker)") from None
        try:
            client = sdk_client()
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means no usable daemon
            raise DockerError(f"no docker daemon answers ({type(exc).__name__}: {exc}); start dockerd or use a local image") from None
        return cls(client)

    # images
    def exists(self, ref: str) -> bool:
        import docker.errors

        try:
            self._client.images.get(ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    def image_id(self, ref: str) -> str:
        return self._client.images.get(ref).id

    def image_env(self, ref: str) -> dict[str, str]:
        """The environment an image declares (its ``ENV`` lines)."""
        entries = (self._client.images.get(ref).attrs.get("Config") or {}).get("Env") or []
        return dict(e.split("=", 1) for e in entries if "=" in e)

    def pull(self, ref: str) -> None:
        try:
            self._client.images.pull(ref)
        except Exception as exc:  # noqa: BLE001 - any pull failure makes the image unusable
            raise DockerError(f"pulling {ref} failed: {exc}") from None

    def build(self, context: Path, dockerfile: str, tag: str, buildargs: dict[str, str] | None, network: str) -> Iterator[str]:
        """Build ``tag`` from ``context``; yields the build's output lines, DockerError on failure."""
        tail: list[str] = []
        try:
            for entry in self._client.api.build(path=str(context), dockerfile=dockerfile, tag=tag, buildargs=buildargs,
                                                network_mode=network, rm=True, forcerm=True, decode=True):
                for line in filter(str.strip, entry.get("stream", "").splitlines()):
                    tail = (tail + [line.strip()])[-5:]
                    yield line
                if "error" in entry:
                    raise DockerError(f"{entry['error'].strip()} (last output: {' | '.join(tail)})")
        except DockerError:
            raise
        except Exception as exc:  # noqa: BLE001 - API and connection errors alike
            raise DockerError(str(exc)) from None

    def import_tarball(self, tarball: Path, tag: str, changes: list[str]) -> None:
        repository, _, version = tag.partition(":")
        self._client.api.import_image_from_file(str(tarball), repository=repository, tag=version, changes=changes)

    def image_files(self, ref: str, argv: list[str]) -> "ImageFiles":
        """A container of ``ref`` for reading its files (see :class:`ImageFiles`)."""
        return ImageFiles(self._client, ref, argv)

    # containers
    def labelled(self, label: str) -> list[ContainerInfo]:
        """Every container, running or not, that carries ``label``."""
        return [ContainerInfo(c.id, c.name, c.status, dict(c.labels or {}))
                for c in self._client.containers.list(all=True, filters={"label": label})]

    def remove(self, container_id: str) -> None:
        """Force-remove a container; one that is gone already is fine, DockerError otherwise."""
        import docker.errors

        try:
            self._client.containers.get(container_id).remove(force=True)
        except docker.errors.NotFound:
            return
        except docker.errors.DockerException as exc:
            raise DockerError(str(exc)) from None

    def container_name(self, container_id: str) -> str | None:
        """The name of a container, or None when it is unknown here."""
        try:
            return self._client.containers.get(container_id).name
        except Exception:  # noqa: BLE001 - a container that vanished or a daemon error: name unknown
            return None

    def container(self, spec: ContainerSpec, keep: bool = False) -> "Container":
        return Container(self._client, spec, keep)

    # the daemon
    def version(self) -> dict[str, Any]:
        return self._client.version()

    def runtimes(self) -> dict[str, Any]:
        return self._client.info().get("Runtimes") or {}


class Container:
    """One container made from a :class:`ContainerSpec`; see the module docstring."""

    def __init__(self, client: Any, spec: ContainerSpec, keep: bool):
        self._client, self.spec, self.keep = client, spec, keep
        self._container: Any = None
        self._owner: Any = None

    def __enter__(self) -> "Container":
        import docker.errors

        try:
            self._container = self._client.containers.create(
                self.spec.image, self.spec.argv, name=self.spec.name, labels=self.spec.labels, environment=self.spec.env,
                working_dir=self.spec.workdir, init=True, ipc_mode="host", network_mode="host",
                volumes={path: {"bind": path, "mode": "ro" if ro else "rw"} for path, ro in self.spec.mounts.items()},
                device_requests=_device_requests(self.spec.gpus),
                stdin_open=True, detach=False,  # with detach=False the SDK sets StdinOnce: the owner pipe below
            )
            self._owner = self._container.attach_socket(params={"stdin": 1, "stream": 1})
        except docker.errors.DockerException as exc:
            self.__exit__(None, None, None)
            raise DockerError(str(exc)) from None
        return self

    @property
    def name(self) -> str:
        return self._container.name

    def start(self) -> None:
        self._container.start()

    def lines(self) -> Iterator[str]:
        """The container's output (stdout and stderr) as it comes, in chunks of text."""
        for chunk in self._container.logs(stream=True, follow=True):
            yield chunk.decode("utf-8", errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit code; ContainerTimeout when it runs past ``timeout`` seconds."""
        import requests.exceptions

        try:
            return self._container.wait(timeout=timeout)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            raise ContainerTimeout(f"still running after {timeout:g} s") from None

    def stop(self, grace: float) -> None:
        """Make sure it is not running: SIGTERM, then kill after ``grace`` s."""
        import docker.errors

        try:
            self._container.reload()
            if self._container.status == "running":
                self._container.stop(timeout=max(1, int(grace)))
        except docker.errors.NotFound:
            pass

    def commit(self, tag: str) -> None:
        repository, _, version = tag.rpartition(":")
        self._container.commit(repository=repository, tag=version)

    def __exit__(self, *exc_info) -> None:
        if self._owner is not None:
            self._owner.close()
        if self._container is not None and not self.keep:
            self._container.remove(force=True)


class ImageFiles:
    """One container of an image, created (no network) when the block starts and removed when it
    ends, however it ends: its files are read with ``archive``; ``output`` runs its command first
    when a listing is needed."""

    def __init__(self, client: Any, ref: str, argv: list[str]):
        self._client, self.ref, self.argv = client, ref, argv
        self._container: Any = None

    def __enter__(self) -> "ImageFiles":
        import docker.errors

        try:
            self._container = self._client.containers.create(self.ref, self.argv, network_disabled=True)
        except docker.errors.DockerException as exc:
            raise DockerError(f"creating a container of {self.ref}: {exc}") from None
        return self

    def output(self, timeout: float) -> str:
        """Run the command to its end: its stdout. DockerError when it cannot start, exits
        non-zero or runs past ``timeout`` seconds."""
        import docker.errors
        import requests.exceptions

        try:
            self._container.start()
            code = self._container.wait(timeout=timeout)["StatusCode"]
            out = self._container.logs(stdout=True, stderr=False).decode("utf-8", errors="replace")
            err = self._container.logs(stdout=False, stderr=True).decode("utf-8", errors="replace")
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise DockerError(f"{' '.join(self.argv[:1])} in {self.ref}: {exc}") from None
        if code != 0:
            raise DockerError(f"{' '.join(self.argv[:1])} in {self.ref} exited with {code}: {err.strip()[-500:]}")
        return out

    def archive(self, path: str, into: IO[bytes]) -> None:
        """``docker cp``: the tar stream of ``path`` written to ``into``; DockerError when the image
        has no such path."""
        import docker.errors

        try:
            stream, _ = self._container.get_archive(path)
            for chunk in stream:
                into.write(chunk)
        except docker.errors.NotFound:
            raise DockerError(f"image {self.ref} has no {path}") from None

    def __exit__(self, *exc_info) -> None:
        if self._container is not None:
            self._container.remove(force=True)


def _device_requests(gpus: str | int | None) -> list[Any]:
    """GPUs for the container: none without GPUs on the host or when the spec asks for none."""
    import glob

    import docker.types

    if gpus is None or not glob.glob("/dev/nvidia[0-9]*"):
        return []
    return [docker.types.DeviceRequest(count=-1 if gpus == "all" else int(gpus), capabilities=[["gpu"]])]
