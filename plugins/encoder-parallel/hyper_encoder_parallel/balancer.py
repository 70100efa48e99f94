"""The per-micro-step balancing of the vision encoder (imported only when a run enables it).

A forward pre-hook on the model (inside DDP's wrapper; after FSDP2's root pre-forward, so the
root's parameters are unsharded) takes over the images of every training forward:

1. all ranks all-gather a small header (image count, input layout) and one int64 record per
   image (patch rows, ``image_grid_thw``...), as Python objects over a gloo group. The records
   come from the micro-batch's host tensors (the collate's, kept by
   :meth:`EncoderBalancer.wrap_get_batch` when the run's ``get_batch`` moves them), so the host
   never waits for the device here, and no collective on the device waits for the host;
2. every rank runs the same deterministic planner on the same costs (LPT + local search);
3. pixel patches go to their computing rank (``all_to_all_single`` with uneven splits);
4. each rank runs the encoder **once** on its share, or on a zero-pixel copy of the smallest
   image when its share is empty, so FSDP2's per-block all-gathers stay matched;
5. the per-image features return to their owners through the core's differentiable
   :func:`~hyper_core.parallel.all_to_all.all_to_all`, whose backward
   sends the gradients back the same way, so the encoder parameters get them on the rank that
   computed them; DDP/FSDP2 then reduce encoder gradients over ranks as usual, which gives the
   same sum as when every rank encodes its own images;
6. the owner's forward gets the features through ``adapter.inject_vision_outputs`` and no
   pixels, so the model never calls the encoder itself.

A rank's loss must depend on what it computed for others, or its backward would never reach the
exchange (and the other ranks would wait for it): a zero-size slice of the received features
(or of the dummy's) is summed into the input embeddings' output, adding exactly 0.

A micro-step where no rank has images changes nothing (no encoder call anywhere). Evaluation
and ``no_grad`` forwards are left alone.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist

from hyper_core.adapters.vision_context import VisionContext
from hyper_core.adapters.vision_outputs import FlatOutputs
from hyper_core.errors import DataError
from hyper_core.parallel.all_to_all import all_to_all

from .config import EncoderParallelConfig
from .planner import image_cost, imbalance, loads, plan
from .vision_io import Schema, merge_inputs

if TYPE_CHECKING:
    from hyper_core.types import GetBatch, MicroBatch

log = logging.getLogger("hyper_train.encoder_parallel")


@dataclass
class _Image:
    """One image of the micro-step, known to every rank."""

    owner: int
    index: int  # position among the owner's images
    record: list[int]

    @property
    def rows(self) -> int:
        return self.record[0]


@dataclass
class Stats:
    """What the balancer saw; the interval fields reset at every log."""

    encoder_calls: int = 0  # cumulative: encoder forwards on this rank
    micro_steps: int = 0  # cumulative: training forwards seen
    micro_steps_with_images: int = 0  # cumulative
    images_owned: int = 0  # cumulative
    images_computed: int = 0  # cumulative (dummies excluded)
    dummy_calls: int = 0  # cumulative
    # -- since the last log
    n: int = 0
    sum_before: float = 0.0
    sum_after: float = 0.0
    rebalanced: int = 0
    images: int = 0
    images_moved: int = 0
    encoder_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The cumulative counters (for tests and benchmarks)."""
        keys = (
            "encoder_calls",
            "micro_steps",
            "micro_steps_with_images",
            "images_owned",
            "images_computed",
            "dummy_calls",
        )
        return {k: getattr(self, k) for k in keys}


class EncoderBalancer:
    """Balances the vision encoder of ``model`` (the unwrapped module) over ``group``."""

    def __init__(
        self,
        model: torch.nn.Module,
        adapter: Any,
        input_keys: Sequence[str],
        settings: EncoderParallelConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        group: Any = None,
        host_group: Any = None,
        video_keys: Sequence[str] = (),
        meta_keys: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.adapter = adapter
        self.keys = tuple(input_keys)
        #: The videos' keys (``VisionEncoderSpec.video_keys``), matching :attr:`keys` one to
        #: one: the adapter splits and injects videos as entries after the images.
        self.video_keys = tuple(video_keys)
        #: Per-image metadata keys (``VisionEncoderSpec.meta_keys``): each image's rows of the
        #: micro-batch's ``image_meta`` travel in its record, after its input metadata.
        self.meta_keys = tuple(meta_keys)
        self.settings = settings
        self.rank = rank
        self.world = world_size
        self.device = device
        self.group = group
        #: Where the integer metadata goes (gloo: host to host); pixels and features use
        #: :attr:`group`.
        self.host_group = host_group if host_group is not None else group
        self.stats = Stats()
        self._anchor: torch.Tensor | None = None
        self._logged_step = 0
        self._handles: list[Any] = []
        #: The last micro-batch ``get_batch`` moved: its device model inputs (weakly) and the
        #: host micro-batch (model inputs, ``image_meta``).
        self._moved: tuple[list[weakref.ref[torch.Tensor]], MicroBatch] | None = None

    # -- hooks ----------------------------------------------------------------------------------

    def install(self) -> None:
        """Hook the model's forward and its input embeddings."""
        embeddings = self.model.get_input_embeddings()
        if embeddings is None:
            raise RuntimeError("encoder_parallel: the model has no input embeddings to anchor to")
        self._handles = [
            self.model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
            self.model.register_forward_hook(self._post_forward),
            embeddings.register_forward_hook(self._add_anchor),
        ]

    def remove(self) -> None:
        """Undo :meth:`install`."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def wrap_get_batch(self, get_batch: GetBatch) -> GetBatch:
        """``get_batch`` that also keeps the host model inputs of the micro-batch it moves, for
        the forward that receives its device tensors (:meth:`rebalance` reads the images' sizes
        and metadata there, not on the device)."""

        def get_batch_keeping_host_inputs(
            micro_batch: MicroBatch,
        ) -> tuple[dict[str, Any], dict[str, Any]]:
            model_inputs, loss_inputs = get_batch(micro_batch)
            self._moved = None
            if any(model_inputs.get(k) is not None for k in (self.keys[0], *self.video_keys[:1])):
                moved = [v for v in model_inputs.values() if isinstance(v, torch.Tensor)]
                self._moved = ([weakref.ref(t) for t in moved], micro_batch)
            return model_inputs, loss_inputs

        return get_batch_keeping_host_inputs

    def _pre_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not module.training or not torch.is_grad_enabled():
            return None
        if not self.video_keys and any(
            kwargs.get(k) is not None for k in ("pixel_values_videos", "video_grid_thw")
        ):
            # Each rank would run the tower on its own videos inside the model, a number of
            # times no other rank knows: fail now rather than hang in FSDP's all-gathers.
            raise DataError(
                "encoder_parallel: this micro-batch has videos and the adapter's vision "
                "encoder takes images only (its VisionEncoderSpec has no video_keys); train "
                "video data without [encoder_parallel]"
            )
        return args, self.rebalance(kwargs)

    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._anchor is not None:
            self._anchor = None
            raise RuntimeError(
                "encoder_parallel: the model's forward did not call its input embeddings, so "
                "the vision features computed here for other ranks cannot get gradients"
            )

    def _add_anchor(self, module: torch.nn.Module, args: Any, output: torch.Tensor) -> Any:
        anchor, self._anchor = self._anchor, None
        if anchor is None:
            return None
        return output + anchor.to(output.dtype)

    # -- the micro-step -------------------------------------------------------------------------

    def rebalance(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The forward's keyword arguments with the images balanced (a collective)."""
        self.stats.micro_steps += 1
        images, context = self._images(kwargs)
        keys = self.record_keys
        described = self._with_meta(images, context)
        schema = Schema.of(keys, described[0]) if described else None
        header = schema.header(len(images)) if schema is not None else [0] * Schema.header_len(keys)
        records = schema.records(described) if schema is not None else []
        gathered = self._all_gather_objects((header, records))
        headers = [h for h, _ in gathered]
        if sum(h[0] for h in headers) == 0:
            return kwargs
        schema = self._agree(headers)
        catalog = [
            _Image(rank, i, record)
            for rank, (_, recs) in enumerate(gathered)
            for i, record in enumerate(recs)
        ]
        self.stats.micro_steps_with_images += 1
        self.stats.images_owned += len(images)
        s = self.settings
        costs = [image_cost(img.rows, s.cost_model, s.attention_patches) for img in catalog]
        owners = [img.owner for img in catalog]
        before = imbalance(loads(costs, owners, self.world))
        if len(catalog) >= s.min_images and before > s.min_imbalance:
            assignment = plan(costs, owners, self.world)
        else:
            assignment = list(owners)
        after = imbalance(loads(costs, assignment, self.world))
        st = self.stats
        st.n += 1
        st.sum_before += before
        st.sum_after += after
        st.images += len(catalog)
        moved = sum(a != o for a, o in zip(assignment, owners, strict=True))
        st.images_moved += moved
        if not moved:
            return self._local(kwargs, images, catalog, schema, context)
        st.rebalanced += 1
        return self._exchange(kwargs, images, catalog, assignment, schema, context)

    def _local(
        self,
        kwargs: dict[str, Any],
        images: list[dict[str, Any]],
        catalog: list[_Image],
        schema: Schema,
        context: VisionContext,
    ) -> dict[str, Any]:
        """Every rank encodes its own images (a rank without any encodes a dummy)."""
        if images:
            self.stats.images_computed += len(images)
            # the forward's own device inputs: all of this rank's images (then videos)
            vision_inputs = self._vision_inputs(kwargs)
            assert vision_inputs is not None  # it has images
            outputs = self._encode(vision_inputs, context)
            return self.adapter.inject_vision_outputs(kwargs, outputs, context)
        flat = FlatOutputs(self._encode(*self._dummy(catalog, schema), dummy=True), 1)
        self._anchor = flat.pack()[:0].sum()
        return self._without_pixels(kwargs)

    def _exchange(
        self,
        kwargs: dict[str, Any],
        images: list[dict[str, Any]],
        catalog: list[_Image],
        assignment: list[int],
        schema: Schema,
        context: VisionContext,
    ) -> dict[str, Any]:
        me, world = self.rank, self.world
        gid = {id(img): g for g, img in enumerate(catalog)}
        mine = [img for img in catalog if img.owner == me]
        # Both sides order a pair's images by the owner's index: the owner sends them sorted
        # by destination, the computing rank receives them sorted by source.
        outgoing = sorted(mine, key=lambda img: (assignment[gid[id(img)]], img.index))
        computed = [img for img in catalog if assignment[gid[id(img)]] == me]
        send_rows = [0] * world
        for img in mine:
            send_rows[assignment[gid[id(img)]]] += img.rows
        recv_rows = [0] * world
        for img in computed:
            recv_rows[img.owner] += img.rows
        # 1. pixels to the computing ranks (no gradient)
        if outgoing:
            send = torch.cat([images[img.index][self.keys[0]] for img in outgoing], dim=0)
        else:
            send = schema.empty_patches(0, self.device)
        recv = schema.empty_patches(sum(recv_rows), self.device)
        tdist.all_to_all_single(recv, send.contiguous(), recv_rows, send_rows, group=self.group)
        # 2. encode this rank's share (or a dummy)
        if computed:
            pieces = recv.split([img.rows for img in computed], dim=0)
            shared = [img.record for img in computed]
            metas = schema.metadata_of(shared, self.device, self.keys[1:])
            share = [
                {self.keys[0]: piece, **meta} for meta, piece in zip(metas, pieces, strict=True)
            ]
            self.stats.images_computed += len(computed)
            out = self._encode(merge_inputs(share, self.keys), self._context_of(schema, shared))
            flat = FlatOutputs(out, len(computed))
        else:
            out = self._encode(*self._dummy(catalog, schema), dummy=True)
            flat = FlatOutputs(out, 1)
        packed = flat.pack()
        # 3. token rows per image back to the owners (sizes for the feature exchange; host)
        sizes = zip(computed, flat.rows[: len(computed)], strict=True)  # (not the dummy's)
        done = [(img.owner, img.index, rows) for img, rows in sizes]
        rows_of = {
            index: rows
            for part in self._all_gather_objects(done)
            for owner, index, rows in part
            if owner == me
        }
        tokens = [rows_of[img.index] for img in outgoing]
        # 4. features back to the owners (differentiable)
        feat_send = [0] * world
        if computed:
            for img, rows in zip(computed, flat.rows, strict=True):
                feat_send[img.owner] += rows
        feat_recv = [0] * world
        for img, rows in zip(outgoing, tokens, strict=True):
            feat_recv[assignment[gid[id(img)]]] += rows
        # a dummy's rows at the end of ``packed`` are not sent: they get a zero gradient,
        # which still runs the encoder's backward on this rank
        received = all_to_all(packed[: sum(feat_send)], feat_send, feat_recv, self.group)
        self._anchor = received[:0].sum()
        if not mine:
            return self._without_pixels(kwargs)
        # 5. this rank's images, in its own order
        blocks = received.split(tokens, dim=0)
        per_image: list[list[torch.Tensor]] = [[] for _ in mine]
        for img, block in zip(outgoing, blocks, strict=True):
            per_image[img.index] = flat.unpack(block)
        return self.adapter.inject_vision_outputs(kwargs, flat.rebuild(per_image), context)

    # -- helpers --------------------------------------------------------------------------------

    def _images(self, kwargs: Mapping[str, Any]) -> tuple[list[dict[str, Any]], VisionContext]:
        """This forward's images (each one's device patches and its host metadata) and their
        :class:`VisionContext` (the micro-batch's ``image_meta``).

        The adapter splits the host inputs that :meth:`wrap_get_batch` kept (its patch counts
        and the records are then read without waiting for the device); the device patch tensor
        is cut at the same rows. They are this forward's when one of its tensors is one that
        ``get_batch`` returned (not the patches: FSDP2 casts floating inputs to its
        ``param_dtype``, a new tensor). Without them (a forward not fed by the run's
        ``get_batch``) the device inputs are split, which waits for the device, and the
        context has no ``image_meta``.
        """
        patch_key = self.keys[0]
        moved, self._moved = self._moved, None
        given = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
        ours = moved is not None and any(ref() is t for ref in moved[0] for t in given)
        meta = dict(moved[1].image_meta) if ours and moved is not None else {}
        context = VisionContext(config=self.model.config, image_meta=meta)
        vision_inputs = self._vision_inputs(kwargs)
        if vision_inputs is None:
            return [], context
        patches = vision_inputs[patch_key]
        if ours and moved is not None:
            images = self.adapter.split_vision_inputs(moved[1].model_inputs, context)
            rows = [int(img[patch_key].shape[0]) for img in images]
            if sum(rows) == patches.shape[0]:
                chunks = patches.split(rows, dim=0)
                cut = [{**img, patch_key: c} for img, c in zip(images, chunks, strict=True)]
                return cut, context
        log.debug("encoder_parallel: image metadata read from the device")
        return self.adapter.split_vision_inputs(kwargs, context), context

    @property
    def record_keys(self) -> tuple[str, ...]:
        """What an image's record holds: its input keys, then its per-image metadata."""
        return (*self.keys, *self.meta_keys)

    def _with_meta(
        self, images: list[dict[str, Any]], context: VisionContext
    ) -> list[dict[str, Any]]:
        """``images`` with each one's :attr:`meta_keys` rows (``(1, ...)``) added."""
        if not self.meta_keys:
            return images
        meta = {k: context.image_meta[k] for k in self.meta_keys}
        return [
            {**img, **{k: v[i : i + 1] for k, v in meta.items()}} for i, img in enumerate(images)
        ]

    def _context_of(self, schema: Schema, records: Sequence[Sequence[int]]) -> VisionContext:
        """The context of the images of ``records`` (their metadata on the host)."""
        meta = schema.host_metadata_of(records, self.meta_keys) if self.meta_keys else {}
        return VisionContext(config=self.model.config, image_meta=meta)

    def _vision_inputs(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor] | None:
        """The encoder's inputs for all of ``inputs``' images, then its videos: each of
        :attr:`keys` with the matching video key's tensor concatenated after it; None when
        there is neither."""
        found: dict[str, torch.Tensor] = {}
        for i, key in enumerate(self.keys):
            video = self.video_keys[i] if i < len(self.video_keys) else None
            parts = [inputs.get(k) for k in (key, video) if k is not None]
            parts = [t for t in parts if isinstance(t, torch.Tensor)]
            if parts:
                found[key] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return found if self.keys[0] in found else None

    def _encode(
        self, inputs: Mapping[str, Any], context: VisionContext, dummy: bool = False
    ) -> Any:
        self.stats.encoder_calls += 1
        self.stats.dummy_calls += int(dummy)
        if not self.settings.profile:
            return self.adapter.call_vision_encoder(self.model, inputs, context)
        _sync(self.device)
        t0 = time.perf_counter()
        out = self.adapter.call_vision_encoder(self.model, inputs, context)
        _sync(self.device)
        self.stats.encoder_ms += (time.perf_counter() - t0) * 1e3
        return out

    def _without_pixels(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        dropped = {*self.keys, *self.video_keys}
        return {k: v for k, v in kwargs.items() if k not in dropped}

    def _dummy(
        self, catalog: list[_Image], schema: Schema
    ) -> tuple[dict[str, torch.Tensor], VisionContext]:
        """Zero pixels shaped like the micro-step's smallest image (its gradient is zero), and
        that image's context."""
        smallest = min(catalog, key=lambda img: img.rows)
        patches = torch.zeros(
            (smallest.rows, *schema.patch_trailing), dtype=schema.patch_dtype, device=self.device
        )
        meta = schema.metadata_of([smallest.record], self.device, self.keys[1:])[0]
        return {self.keys[0]: patches, **meta}, self._context_of(schema, [smallest.record])

    def _agree(self, headers: list[list[int]]) -> Schema:
        """The input layout, which every rank with images must share."""
        described = {tuple(h[1:]) for h in headers if h[0] > 0}
        if len(described) != 1:
            raise RuntimeError(
                f"encoder_parallel: ranks disagree on the vision inputs: {described}"
            )
        first = next(h for h in headers if h[0] > 0)
        return Schema.from_header(self.record_keys, first)

    def _all_gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (small Python data), over :attr:`host_group`."""
        out: list[Any] = [None] * self.world
        tdist.all_gather_object(out, value, group=self.host_group)
        return out

    # -- metrics --------------------------------------------------------------------------------

    def flush_metrics(self, global_step: int) -> dict[str, float]:
        """The interval's averages for ``metrics.jsonl``; resets them. With ``profile`` a
        collective (every rank logs at the same steps)."""
        st = self.stats
        out: dict[str, float] = {}
        if st.n:
            out["encoder_parallel/imbalance_before"] = st.sum_before / st.n
            out["encoder_parallel/imbalance_after"] = st.sum_after / st.n
            out["encoder_parallel/rebalanced"] = st.rebalanced / st.n
            out["encoder_parallel/images_moved"] = st.images_moved / max(st.images, 1)
        if self.settings.profile:
            steps = max(global_step - self._logged_step, 1)
            per_rank = [float(ms) for ms in self._all_gather_objects(st.encoder_ms / steps)]
            out["encoder_parallel/encoder_ms_max"] = max(per_rank)
            out["encoder_parallel/encoder_ms_mean"] = sum(per_rank) / len(per_rank)
        self._logged_step = global_step
        st.n = st.rebalanced = st.images = st.images_moved = 0
        st.sum_before = st.sum_after = st.encoder_ms = 0.0
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def install(
    model: torch.nn.Module,
    strategy: Any,
    adapter: Any,
    input_keys: Sequence[str],
    settings: EncoderParallelConfig,
    dist: Any,
    video_keys: Sequence[str] = (),
    meta_keys: Sequence[str] = (),
) -> EncoderBalancer:
    """Balance ``model``'s encoder over all ranks (a collective: creates process groups).

    Pixels and features go over a new group of the run's backend; the integer metadata over
    gloo (host to host): that same group on a gloo run, a gloo group next to it otherwise.
    """
    inner = strategy.unwrap(model)
    group = tdist.new_group()
    gloo = tdist.get_backend(group) == "gloo"
    host_group = group if gloo else tdist.new_group(backend="gloo")
    balancer = EncoderBalancer(
        inner,
        adapter,
        input_keys,
        settings,
        rank=dist.rank,
        world_size=dist.world_size,
        device=dist.device,
        group=group,
        host_group=host_group,
        video_keys=video_keys,
        meta_keys=meta_keys,
    )
    balancer.install()
    return balancer
