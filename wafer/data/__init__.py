"""Input pipelines on grain and the data sources of the reference models (issue 5)."""

from wafer.data.pipeline import ArraySource as ArraySource
from wafer.data.pipeline import GrainBatchSource as GrainBatchSource
from wafer.data.pipeline import shard_indices as shard_indices
from wafer.data.pipeline import total_workers as total_workers
from wafer.data.pipeline import worker_seeds as worker_seeds
from wafer.errors import DataError as DataError

__all__ = ["ArraySource", "DataError", "GrainBatchSource", "shard_indices", "total_workers", "worker_seeds"]
