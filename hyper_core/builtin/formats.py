"""The core's dataset formats: ``jsonl``, ``parquet`` and ``hf`` conversations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..types import Register


@hookimpl
def register_dataset_formats(register: Register) -> None:
    """``jsonl`` (conversation lines), ``parquet`` (files or a folder of them) and ``hf`` (a
    Hugging Face data set's parquet files), each with its options class."""
    data = "hyper_core.data"
    register("jsonl", f"{data}.jsonl:load_jsonl_format", options=f"{data}.jsonl:JsonlOptions")
    parquet_options = f"{data}.parquet:ParquetOptions"
    register("parquet", f"{data}.parquet:load_parquet_format", options=parquet_options)
    register("hf", f"{data}.parquet:load_hf_format", options=parquet_options)
