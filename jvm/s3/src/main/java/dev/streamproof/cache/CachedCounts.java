package dev.streamproof.cache;

import java.io.Serializable;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.Dataset$;
import org.apache.spark.sql.columnar.CachedBatch;
import org.apache.spark.sql.columnar.SimpleMetricsCachedBatch;
import org.apache.spark.sql.execution.CachedData;
import org.apache.spark.sql.execution.columnar.CachedRDDBuilder;
import org.apache.spark.sql.execution.columnar.ColumnAccessor;
import org.apache.spark.sql.execution.columnar.ColumnAccessor$;
import org.apache.spark.sql.execution.columnar.DefaultCachedBatch;
import org.apache.spark.sql.execution.columnar.DefaultCachedBatchSerializer;
import org.apache.spark.sql.execution.columnar.InMemoryRelation;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A cached micro-batch's counts (its records, those with a reject reason, its oldest record's time) read from the
 * statistics Spark's cache keeps of every batch of rows it holds, and its rejected records themselves, in the one
 * job that fills the cache.
 *
 * <p>Why: a micro-batch is cached so that Kafka is read and its records parsed once for every write that follows.
 * Its counts were one more query over the cache (a grouped aggregation, two more jobs: on a fresh JVM about half a
 * second of the first batch), and its rejected records, a few hundred of 500,000, a scan of the whole cache by the
 * quarantine's write job, in one task. Spark's default cache serializer already counts every column's nulls and
 * keeps its bounds per batch of rows ({@code DefaultCachedBatch.stats}: lower bound, upper bound, null count, count,
 * size for each column): the counts are those statistics summed. The rejected records are decoded, in the same
 * tasks, from the batches of rows whose statistics say they hold one, and come back to the driver as a local
 * relation the quarantine's write reads. Each partition's figures and rows come back once, from the task that
 * finished it (a result job).
 *
 * <p>Python calls {@link #of}: {@code streamproof.pipeline.batches.BatchWriter}.
 */
public final class CachedCounts {
  private static final int STATS_PER_COLUMN = 5; // lower bound, upper bound, null count, count, size in bytes
  private static final int LOWER_BOUND = 0;
  private static final int NULL_COUNT = 2;
  // The types of the columns a quarantined record has (coordinates, reason, bytes) that are gathered.
  private static final List<DataType> GATHERED_TYPES =
      List.of(
          DataTypes.StringType,
          DataTypes.IntegerType,
          DataTypes.LongType,
          DataTypes.TimestampType,
          DataTypes.BinaryType);

  private final long records;
  private final long rejected;
  private final Long leastMicros;
  private final Dataset<Row> rejectedRows;

  private CachedCounts(long records, long rejected, Long leastMicros, Dataset<Row> rejectedRows) {
    this.records = records;
    this.rejected = rejected;
    this.leastMicros = leastMicros;
    this.rejectedRows = rejectedRows;
  }

  /** The batch's rows. */
  public long records() {
    return records;
  }

  /** Its rows whose reject column is set. */
  public long rejected() {
    return rejected;
  }

  /** The least value of the time column (micros), null when it had none. */
  public Long leastMicros() {
    return leastMicros;
  }

  /**
   * The rejected rows, of the columns asked for (the reject column among them), as a local relation; null when none
   * were asked for or a partition held more than the bound (the caller reads them from the cache then).
   */
  public Dataset<Row> rejectedRows() {
    return rejectedRows;
  }

  /**
   * The counts of {@code cached}, and its rows whose {@code rejectColumn} is set, of the columns {@code rowsOf} (none:
   * not gathered), when no partition holds more than its share of {@code maxRows} rows or {@code maxBytes} bytes of
   * values (each divided by the number of partitions): the driver never holds more than that of them (a batch of
   * large rejected records is read from the cache by the quarantine's own job instead). Null when {@code cached}
   * is not a cached Dataset of Spark's default cache serializer, a column is missing, or {@code timeColumn} is not a
   * long or a timestamp: the caller counts its own way then. Fills the cache when it is not yet.
   */
  public static CachedCounts of(
      Dataset<?> cached, String rejectColumn, String timeColumn, List<String> rowsOf, int maxRows, long maxBytes) {
    Option<CachedData> found = cached.sparkSession().sharedState().cacheManager().lookupCachedData(cached);
    if (found.isEmpty()) {
      return null;
    }
    InMemoryRelation relation = found.get().cachedRepresentation();
    CachedRDDBuilder builder = relation.cacheBuilder();
    if (!(builder.serializer() instanceof DefaultCachedBatchSerializer)) {
      return null;
    }
    List<Attribute> output = CollectionConverters.asJava(relation.output());
    int rejectAt = indexOf(output, rejectColumn);
    int timeAt = timeColumn == null ? -1 : indexOf(output, timeColumn);
    if (rejectAt < 0 || (timeColumn != null && timeAt < 0)) {
      return null;
    }
    if (timeAt >= 0) {
      DataType type = output.get(timeAt).dataType();
      if (!type.equals(DataTypes.LongType) && !type.equals(DataTypes.TimestampType)) {
        return null;
      }
    }
    List<Attribute> rowAttributes = new ArrayList<>();
    int[] rowColumns = new int[rowsOf.size()];
    DataType[] rowTypes = new DataType[rowsOf.size()];
    int rejectInRow = -1;
    for (int i = 0; i < rowColumns.length; i++) {
      rowColumns[i] = indexOf(output, rowsOf.get(i));
      if (rowColumns[i] < 0) {
        return null;
      }
      Attribute attribute = output.get(rowColumns[i]);
      rowAttributes.add((Attribute) attribute.newInstance());
      rowTypes[i] = attribute.dataType();
      if (rowColumns[i] == rejectAt) {
        rejectInRow = i;
      }
    }
    if (rejectInRow < 0 || !GATHERED_TYPES.containsAll(java.util.Arrays.asList(rowTypes))) {
      rowColumns = new int[0]; // counted only: the caller reads the rejected rows from the cache
      rowTypes = new DataType[0];
    }
    org.apache.spark.api.java.JavaRDD<CachedBatch> cachedBatches = builder.cachedColumnBuffers().toJavaRDD();
    int partitionCount = Math.max(1, cachedBatches.getNumPartitions());
    PartitionCounts perPartition =
        new PartitionCounts(
            rejectAt,
            timeAt,
            rowColumns,
            rowTypes,
            rejectInRow,
            Math.max(1, maxRows / partitionCount),
            Math.max(1, maxBytes / partitionCount));
    List<Counted> partitions = cachedBatches.mapPartitions(perPartition).collect();
    long records = 0;
    long rejected = 0;
    Long least = null;
    List<InternalRow> rows = new ArrayList<>();
    boolean allRows = rowColumns.length > 0;
    for (Counted partition : partitions) {
      records += partition.records;
      rejected += partition.rejected;
      if (partition.hasLeast) {
        least = least == null ? partition.least : Math.min(least, partition.least);
      }
      if (partition.rows == null) {
        allRows = false;
      } else if (allRows) {
        rows.addAll(partition.rows);
      }
    }
    Dataset<Row> rejectedRows = null;
    if (allRows) {
      LocalRelation local =
          new LocalRelation(
              CollectionConverters.asScala(rowAttributes).toSeq(),
              CollectionConverters.asScala(rows).toSeq(),
              false,
              Option.empty());
      rejectedRows = Dataset$.MODULE$.ofRows(cached.sparkSession(), local);
    }
    return new CachedCounts(records, rejected, least, rejectedRows);
  }

  private static int indexOf(List<Attribute> output, String name) {
    for (int i = 0; i < output.size(); i++) {
      if (output.get(i).name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  /** One partition's figures and rejected rows (null: not gathered, or more than the bound). */
  private static final class Counted implements Serializable {
    private static final long serialVersionUID = 1L;
    long records;
    long rejected;
    long least = Long.MAX_VALUE;
    boolean hasLeast;
    List<InternalRow> rows;
  }

  private static final class PartitionCounts implements FlatMapFunction<Iterator<CachedBatch>, Counted> {
    private static final long serialVersionUID = 1L;
    private final int rejectAt;
    private final int timeAt;
    private final int[] rowColumns;
    private final DataType[] rowTypes;
    private final int rejectInRow;
    private final int maxRows;
    private final long maxBytes;

    PartitionCounts(
        int rejectAt,
        int timeAt,
        int[] rowColumns,
        DataType[] rowTypes,
        int rejectInRow,
        int maxRows,
        long maxBytes) {
      this.rejectAt = rejectAt;
      this.timeAt = timeAt;
      this.rowColumns = rowColumns;
      this.rowTypes = rowTypes;
      this.rejectInRow = rejectInRow;
      this.maxRows = maxRows;
      this.maxBytes = maxBytes;
    }

    @Override
    public Iterator<Counted> call(Iterator<CachedBatch> batches) {
      Counted counted = new Counted();
      boolean gathering = rowColumns.length > 0;
      List<InternalRow> rows = new ArrayList<>();
      long bytes = 0;
      while (batches.hasNext()) {
        SimpleMetricsCachedBatch batch = (SimpleMetricsCachedBatch) batches.next();
        InternalRow stats = batch.stats();
        int batchRows = batch.numRows();
        int rejected = batchRows - stats.getInt(rejectAt * STATS_PER_COLUMN + NULL_COUNT);
        counted.records += batchRows;
        counted.rejected += rejected;
        if (timeAt >= 0 && batchRows > stats.getInt(timeAt * STATS_PER_COLUMN + NULL_COUNT)) {
          counted.least = Math.min(counted.least, stats.getLong(timeAt * STATS_PER_COLUMN + LOWER_BOUND));
          counted.hasLeast = true;
        }
        if (gathering && rejected > 0) {
          if (counted.rejected > maxRows) {
            gathering = false; // the caller reads them from the cache: a partition's rows stay bounded in memory
            rows = null;
            continue;
          }
          bytes += gather((DefaultCachedBatch) batch, batchRows, rows);
          if (bytes > maxBytes) {
            gathering = false;
            rows = null;
          }
        }
      }
      counted.rows = gathering ? rows : null;
      return Collections.singletonList(counted).iterator();
    }

    /**
     * The batch's rows with a reject reason, copied: each column asked for read by its own accessor (Spark's
     * {@code ColumnAccessor}, which the code Spark generates for a scan of the cache calls too), without generating
     * code: on a fresh JVM, compiling the scan's accessor took about 0.2 s of the first batch. Returns the bytes of
     * the values gathered (strings' and binaries' lengths, 8 for any other value).
     */
    private long gather(DefaultCachedBatch batch, int batchRows, List<InternalRow> rows) {
      byte[][] buffers = batch.buffers();
      ColumnAccessor[] accessors = new ColumnAccessor[rowColumns.length];
      for (int i = 0; i < accessors.length; i++) {
        accessors[i] = ColumnAccessor$.MODULE$.apply(rowTypes[i], ByteBuffer.wrap(buffers[rowColumns[i]]));
      }
      GenericInternalRow row = new GenericInternalRow(accessors.length);
      long bytes = 0;
      for (int r = 0; r < batchRows; r++) {
        for (int i = 0; i < accessors.length; i++) {
          accessors[i].extractTo(row, i);
        }
        if (!row.isNullAt(rejectInRow)) {
          InternalRow copy = row.copy();
          rows.add(copy);
          for (int i = 0; i < accessors.length; i++) {
            Object value = copy.isNullAt(i) ? null : copy.get(i, rowTypes[i]);
            bytes += value instanceof UTF8String ? ((UTF8String) value).numBytes()
                : value instanceof byte[] ? ((byte[]) value).length : 8;
          }
        }
      }
      return bytes;
    }
  }
}
