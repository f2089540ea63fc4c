package dev.streamproof.cache;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.columnar.CachedBatch;
import org.apache.spark.sql.columnar.SimpleMetricsCachedBatch;
import org.apache.spark.sql.columnar.SimpleMetricsCachedBatchSerializer;
import org.apache.spark.sql.execution.CachedData;
import org.apache.spark.sql.execution.columnar.CachedRDDBuilder;
import org.apache.spark.sql.execution.columnar.InMemoryRelation;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A cached Dataset's rows, its columns' non-null values and one column's least value, read from the statistics
 * Spark's cache keeps of every batch of rows it holds, in the one job that fills the cache.
 *
 * <p>Why: a micro-batch is cached so that Kafka is read and its records parsed once for every write that follows,
 * and its counts (records, records bound for quarantine, the oldest record's time) were one more query over the
 * cache: a grouped aggregation, two more jobs. On a fresh JVM the aggregation's code generation and its jobs took
 * about half a second of the first batch. Spark's default cache serializer already counts every column's nulls
 * and keeps its bounds per batch of rows ({@code DefaultCachedBatch.stats}: lower bound, upper bound, null count,
 * count, size for each column), so the counts are those statistics summed, per cached partition, by the job that
 * builds the cache. Each partition's figures come back once, from the task that finished it (a result job).
 *
 * <p>Python calls {@link #of}: {@code streamproof.pipeline.batches.BatchWriter}.
 */
public final class CachedCounts {
  private static final int STATS_PER_COLUMN = 5; // lower bound, upper bound, null count, count, size in bytes
  private static final int NULL_COUNT = 2;
  private static final int LOWER_BOUND = 0;

  private CachedCounts() {}

  /**
   * {@code [rows, non-null values of each of nonNullOf..., least value of leastOf (a long or timestamp column: its
   * micros), 1 when leastOf has a non-null value else 0]}; null when {@code cached} is not a cached Dataset of Spark's
   * default cache serializer, a column is missing, or {@code leastOf} is not a long or a timestamp (the caller counts
   * its own way then). Fills the cache when it is not yet.
   */
  public static long[] of(Dataset<?> cached, List<String> nonNullOf, String leastOf) {
    Option<CachedData> found = cached.sparkSession().sharedState().cacheManager().lookupCachedData(cached);
    if (found.isEmpty()) {
      return null;
    }
    InMemoryRelation relation = found.get().cachedRepresentation();
    CachedRDDBuilder builder = relation.cacheBuilder();
    if (!(builder.serializer() instanceof SimpleMetricsCachedBatchSerializer)) {
      return null;
    }
    List<Attribute> output = CollectionConverters.asJava(relation.output());
    int[] nonNullAt = new int[nonNullOf.size()];
    for (int i = 0; i < nonNullAt.length; i++) {
      nonNullAt[i] = indexOf(output, nonNullOf.get(i));
      if (nonNullAt[i] < 0) {
        return null;
      }
    }
    int leastAt = leastOf == null ? -1 : indexOf(output, leastOf);
    if (leastOf != null) {
      if (leastAt < 0) {
        return null;
      }
      DataType type = output.get(leastAt).dataType();
      if (!type.equals(DataTypes.LongType) && !type.equals(DataTypes.TimestampType)) {
        return null;
      }
    }
    List<long[]> partitions =
        builder.cachedColumnBuffers().toJavaRDD().mapPartitions(new PartitionCounts(nonNullAt, leastAt)).collect();
    long[] total = new long[nonNullAt.length + 3];
    int least = nonNullAt.length + 1;
    total[least] = Long.MAX_VALUE;
    for (long[] partition : partitions) {
      for (int i = 0; i < least; i++) {
        total[i] += partition[i];
      }
      if (partition[least + 1] == 1) {
        total[least] = Math.min(total[least], partition[least]);
        total[least + 1] = 1;
      }
    }
    return total;
  }

  private static int indexOf(List<Attribute> output, String name) {
    for (int i = 0; i < output.size(); i++) {
      if (output.get(i).name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  /** One partition's figures, in the layout {@link #of} returns. */
  private static final class PartitionCounts implements FlatMapFunction<Iterator<CachedBatch>, long[]> {
    private static final long serialVersionUID = 1L;
    private final int[] nonNullAt;
    private final int leastAt;

    PartitionCounts(int[] nonNullAt, int leastAt) {
      this.nonNullAt = nonNullAt;
      this.leastAt = leastAt;
    }

    @Override
    public Iterator<long[]> call(Iterator<CachedBatch> batches) {
      long[] counts = new long[nonNullAt.length + 3];
      int least = nonNullAt.length + 1;
      counts[least] = Long.MAX_VALUE;
      while (batches.hasNext()) {
        SimpleMetricsCachedBatch batch = (SimpleMetricsCachedBatch) batches.next();
        InternalRow stats = batch.stats();
        int rows = batch.numRows();
        counts[0] += rows;
        for (int i = 0; i < nonNullAt.length; i++) {
          counts[1 + i] += rows - stats.getInt(nonNullAt[i] * STATS_PER_COLUMN + NULL_COUNT);
        }
        if (leastAt >= 0 && rows > stats.getInt(leastAt * STATS_PER_COLUMN + NULL_COUNT)) {
          counts[least] = Math.min(counts[least], stats.getLong(leastAt * STATS_PER_COLUMN + LOWER_BOUND));
          counts[least + 1] = 1;
        }
      }
      List<long[]> one = new ArrayList<>(1);
      one.add(counts);
      return one.iterator();
    }
  }
}
