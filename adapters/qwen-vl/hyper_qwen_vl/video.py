"""Reading a video part's frames: a video file through PyAV, or a list of frame images.

Frames are sampled the way qwen-vl-utils does: ``duration × fps`` frames, at least
``min_frames`` and at most ``max_frames`` (and the frames there are), a multiple of the
temporal patch size, spread evenly (``linspace(0, total - 1, n)`` rounded). A frame list is
taken as already sampled at ``fps`` and only thinned to ``max_frames``. PyAV is the optional
extra ``hyper-train-qwen-vl[video]``; frame lists need only pillow.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.data.errors import SampleError
from hyper_core.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

    from hyper_core.data.conversation import VideoPart

#: The install hint given when a video file needs PyAV and it is missing.
AV_HINT = "pip install 'hyper-train-qwen-vl[video]' (PyAV)"


@attrs.frozen(kw_only=True)
class FrameSampling:
    """How many frames a video gives: ``fps`` per second of video, within the bounds."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    #: Frames per temporal patch: the count is a multiple of it.
    temporal_patch_size: int = 2


@attrs.frozen(eq=False)
class Clip:
    """A video's sampled RGB frames, their indices among the source's ``total`` frames and
    the source frame rate."""

    frames: list[Image.Image]
    indices: list[int]
    total: int
    source_fps: float

    @property
    def sample_fps(self) -> float:
        """Frames kept per second of video (qwen-vl-utils' ``sample_fps``)."""
        return len(self.frames) / self.total * self.source_fps


def num_frames(total: int, source_fps: float, sampling: FrameSampling) -> int:
    """Frames to keep of ``total`` at ``source_fps`` (qwen-vl-utils' ``smart_nframes``)."""
    factor = sampling.temporal_patch_size
    if total <= factor:
        return total
    low = math.ceil(sampling.min_frames / factor) * factor
    high = max(factor, (min(sampling.max_frames, total) // factor) * factor)
    wanted = total / source_fps * sampling.fps
    return max(factor, int(min(max(wanted, low), high) // factor) * factor)


def sample_indices(total: int, count: int) -> list[int]:
    """``count`` of ``0..total-1`` spread evenly, first and last included."""
    import numpy as np

    if count >= total:
        return list(range(total))
    return [int(i) for i in np.linspace(0, total - 1, count).round().astype(int)]


def read_clip(part: VideoPart, sampling: FrameSampling) -> Clip:
    """The sampled frames of ``part``; :class:`SampleError` ``missing_video``/``corrupt_video``,
    :class:`~hyper_core.errors.DataError` when a video file needs PyAV and it is missing."""
    if part.fps is not None or part.max_frames is not None:
        sampling = attrs.evolve(
            sampling,
            fps=part.fps or sampling.fps,
            max_frames=part.max_frames or sampling.max_frames,
            min_frames=min(sampling.min_frames, part.max_frames or sampling.min_frames),
        )
    if part.frames is not None:
        return _read_frames(list(part.frames), sampling)
    if part.path is None:
        raise SampleError("missing_video", "video part has neither a path nor frames")
    return _read_file(part.path, sampling)


def _read_frames(paths: list[Path], sampling: FrameSampling) -> Clip:
    from hyper_core.data.conversation import ImagePart, load_image

    total = len(paths)
    keep = total
    if total > sampling.max_frames:
        factor = sampling.temporal_patch_size
        keep = max(factor, (sampling.max_frames // factor) * factor)
    indices = sample_indices(total, keep)
    try:
        frames = [load_image(ImagePart(path=paths[i])) for i in indices]
    except SampleError as exc:
        reason = "missing_video" if exc.reason == "missing_image" else "corrupt_video"
        raise SampleError(reason, f"video frame: {exc.message}") from None
    return Clip(frames=frames, indices=indices, total=total, source_fps=sampling.fps)


def _read_file(path: Path, sampling: FrameSampling) -> Clip:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise SampleError("missing_video", f"video not found: {path}") from None
    except OSError as exc:
        raise SampleError("corrupt_video", f"cannot read video {path}: {exc}") from None
    if not stat.S_ISREG(mode):  # a FIFO would block forever
        raise SampleError("missing_video", f"not a regular file: {path}")
    try:
        import av
    except ImportError:
        # DataError: it crosses from a DataLoader worker as itself (one line, exit 2).
        raise DataError(f"video {path} needs PyAV: {AV_HINT}") from None
    try:
        with av.open(str(path)) as container:
            return _decode(container, sampling, path)
    except SampleError:
        raise
    except (av.FFmpegError, OSError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise SampleError("corrupt_video", f"cannot read video {path}: {exc}") from None


def _decode(container: Any, sampling: FrameSampling, path: Path) -> Clip:
    if not container.streams.video:
        raise SampleError("corrupt_video", f"no video stream in {path}")
    stream = container.streams.video[0]
    rate = stream.average_rate or stream.guessed_rate
    source_fps = float(rate) if rate else 0.0
    if source_fps <= 0:
        raise SampleError("corrupt_video", f"video {path} has no frame rate")
    total = int(stream.frames or 0)
    if total <= 0:  # some containers do not say: count the packets
        total = sum(1 for packet in container.demux(stream) if packet.size)
        container.seek(0)
    if total <= 0:
        raise SampleError("corrupt_video", f"no frames in video {path}")
    indices = sample_indices(total, num_frames(total, source_fps, sampling))
    wanted = set(indices)
    frames: dict[int, Image.Image] = {}
    for i, frame in enumerate(container.decode(stream)):
        if i in wanted:
            frames[i] = frame.to_image().convert("RGB")
        if i >= indices[-1]:
            break
    if len(frames) != len(indices):
        raise SampleError(
            "corrupt_video", f"video {path}: decoded {len(frames)} of {len(indices)} frames"
        )
    return Clip(
        frames=[frames[i] for i in indices], indices=indices, total=total, source_fps=source_fps
    )
