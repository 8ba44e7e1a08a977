"""The `tiered-kafka` Spark data source (PySpark's Python Data Source API).

    spark.read.format("tiered-kafka").option("endpoint", "http://127.0.0.1:9000")
        .option("bucket", "tiered").option("topics", "orders").load()

Planning (`partitions`) runs on the driver and reads only the key listing and indexes; `read` runs on
executors, one planned piece per Spark partition, and yields Arrow record batches. Executors get the
reader pickled: it holds only the parsed options, and every process builds its own S3 client.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .arrow import spark_ddl
from .bucket import Bucket
from .catalog import plan_read
from .options import SOURCE_NAME, ReadOptions, parse_read_options
from .planning import Piece
from .reading import read_piece


class PieceInput(InputPartition):
    """One Spark partition: a planned piece of a segment (None: the read found nothing)."""

    def __init__(self, piece: Piece | None) -> None:
        super().__init__(piece)
        self.piece = piece


class TieredKafkaSource(DataSource):
    """Reads Kafka records from tiered segments in an object store, without brokers."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _options(self) -> ReadOptions:
        return parse_read_options(dict(self.options))

    def schema(self) -> str:
        # Validating here makes bad options fail at load(), not at the first action.
        return spark_ddl(self._options().include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TieredKafkaReader(self._options())


class TieredKafkaReader(DataSourceReader):
    """Plans pieces on the driver and decodes them on executors."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        pieces = plan_read(Bucket(self.options.store), self.options)
        # Spark wants at least one partition; an empty piece list reads nothing.
        return [PieceInput(p) for p in pieces] or [PieceInput(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        piece = getattr(partition, "piece", None)
        if piece is None:
            return
        yield from read_piece(
            Bucket(self.options.store),
            piece,
            include_headers=self.options.include_headers,
            skip_corrupt=self.options.skip_corrupt,
        )
