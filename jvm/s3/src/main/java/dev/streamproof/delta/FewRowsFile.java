package dev.streamproof.delta;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.Job;
import org.apache.hadoop.mapreduce.JobID;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.TaskID;
import org.apache.hadoop.mapreduce.TaskType;
import org.apache.hadoop.mapreduce.lib.output.FileOutputFormat;
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Repartition;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.actions.AddFile;
import org.apache.spark.sql.delta.actions.Metadata;
import org.apache.spark.sql.delta.constraints.Constraints$;
import org.apache.spark.sql.execution.datasources.FileFormat;
import org.apache.spark.sql.execution.datasources.OutputWriter;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.metric.SQLMetric;
import org.apache.spark.sql.execution.metric.SQLMetrics;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A few rows the driver already holds, written by the driver as one Parquet file of a Delta table, with the file
 * format, options and Hadoop settings Delta's own writer uses ({@code TransactionalWrite.writeFiles}), without a
 * Spark job.
 *
 * <p>Why: a micro-batch's quarantined records are a few hundred rows, gathered by the job that counts the batch
 * ({@code dev.streamproof.cache.CachedCounts}). Delta's writer made a Spark job of them: its planning, its
 * statistics' code, one task. That took 0.09-0.17 s of a warm batch and 0.51 s of the first, for one small file
 * (docs/performance.md, 2026-11-30).
 *
 * <p>Only for what Delta's writer would write the same way: rows of a local relation (the gathered records), a table
 * without partition columns, constraints, or field metadata (generated or identity columns, column mapping, defaults,
 * invariants), and without deletion vectors or chosen statistics columns. Otherwise {@link #addFile} returns null and
 * the caller uses Delta's writer. Its AddFile carries the statistics Delta's writer gives the file: the rows, each
 * indexed column's nulls, bounds of its strings (when none is longer than Delta keeps), numbers and times
 * ({@code streamproof.sinks.delta_table.few_rows_file}).
 */
public final class FewRowsFile {
  // Delta's defaults for delta.dataSkippingNumIndexedCols and delta.dataSkippingStringPrefixLength.
  private static final int INDEXED_COLUMNS = 32;
  private static final int STRING_PREFIX = 32;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final List<DataType> FLAT_TYPES =
      List.of(
          DataTypes.StringType,
          DataTypes.BinaryType,
          DataTypes.BooleanType,
          DataTypes.ByteType,
          DataTypes.ShortType,
          DataTypes.IntegerType,
          DataTypes.LongType,
          DataTypes.FloatType,
          DataTypes.DoubleType,
          DataTypes.DateType,
          DataTypes.TimestampType);
  private final String name;
  private final long size;
  private final long modificationTime;
  private final long numRecords;
  private final long[] nullCounts;
  private final Object[] minValues;
  private final Object[] maxValues;
  private final long[] longestStrings;

  private FewRowsFile(
      String name,
      long size,
      long modificationTime,
      long numRecords,
      long[] nullCounts,
      Object[] minValues,
      Object[] maxValues,
      long[] longestStrings) {
    this.name = name;
    this.size = size;
    this.modificationTime = modificationTime;
    this.numRecords = numRecords;
    this.nullCounts = nullCounts;
    this.minValues = minValues;
    this.maxValues = maxValues;
    this.longestStrings = longestStrings;
  }

  /**
   * True when {@code rows} read nothing but rows the driver holds (every leaf of its plan a local relation): only
   * those are written by {@link #addFile}. Asked first, from the plan as analyzed, so that a sink's batch (read from
   * Spark's cache) is told at once, without optimizing its plan or reading the table's settings.
   */
  static boolean ofLocalRows(Dataset<Row> rows) {
    return CollectionConverters.asJava(rows.queryExecution().analyzed().collectLeaves()).stream()
        .allMatch(leaf -> leaf instanceof LocalRelation);
  }

  /**
   * The AddFile of {@code rows} written as one file of the table of {@code txn} ({@link #write}), with the statistics
   * Delta's writer gives it, built here rather than read back from JSON: on a fresh JVM, Delta's reading of an action
   * from JSON took 66 ms of a first batch's quarantine, and the settings and statistics asked over Py4J 10-20 ms of
   * every batch's (docs/performance.md, 2026-11-30). Null, writing nothing, when the rows or the table are not of the
   * kind this writes.
   */
  public static AddFile addFile(OptimisticTransaction txn, Dataset<Row> rows) throws Exception {
    if (!ofLocalRows(rows)) {
      return null;
    }
    scala.collection.immutable.Map<String, String> settings = txn.metadata().configuration();
    if (settings.contains("delta.dataSkippingStatsColumns") || txn.protocol().json().contains("deletionVectors")) {
      return null;
    }
    FewRowsFile written = write(txn, rows);
    if (written == null) {
      return null;
    }
    int indexed = setting(settings, "delta.dataSkippingNumIndexedCols", INDEXED_COLUMNS);
    int prefix = setting(settings, "delta.dataSkippingStringPrefixLength", STRING_PREFIX);
    StructField[] fields = txn.metadata().schema().fields();
    int columns = indexed < 0 ? fields.length : Math.min(indexed, fields.length);
    Map<String, Object> least = new LinkedHashMap<>();
    Map<String, Object> most = new LinkedHashMap<>();
    Map<String, Object> nulls = new LinkedHashMap<>();
    for (int i = 0; i < columns; i++) {
      StructField field = fields[i];
      nulls.put(field.name(), written.nullCounts[i]);
      Object low = written.minValues[i];
      Object high = written.maxValues[i];
      if (low == null || (field.dataType().equals(DataTypes.StringType) && written.longestStrings[i] > prefix)) {
        continue; // no bound kept: a reader cannot skip the file on this column, as for any file without one
      }
      if (field.dataType().equals(DataTypes.TimestampType)) { // Delta's: to the millisecond, as an instant
        low = statsTime((Long) low);
        high = statsTime((Long) high);
        if (low == null || high == null) {
          continue; // outside years 1-9999 (a time in microseconds read as milliseconds): no bound kept
        }
      }
      least.put(field.name(), low);
      most.put(field.name(), high);
    }
    Map<String, Object> stats = new LinkedHashMap<>();
    stats.put("numRecords", written.numRecords);
    stats.put("minValues", least);
    stats.put("maxValues", most);
    stats.put("nullCount", nulls);
    return AddFile.apply(
        written.name,
        scala.collection.immutable.Map$.MODULE$.<String, String>empty(),
        written.size,
        written.modificationTime,
        true,
        JSON.writeValueAsString(stats),
        null, // tags: as Delta's writer leaves them
        null, // no deletion vector
        Option.empty(),
        Option.empty(),
        Option.empty(),
        Option.empty(),
        Option.empty());
  }

  /**
   * A timestamp's bound as Delta's statistics write it: to the millisecond (truncated), UTC; null outside the years
   * 1-9999. {@code statsTime(1_700_000_000_123_456L)} is {@code "2023-11-14T22:13:20.123Z"}.
   */
  public static String statsTime(long micros) {
    ZonedDateTime moment = Instant.ofEpochMilli(Math.floorDiv(micros, 1000L)).atZone(ZoneOffset.UTC);
    if (moment.getYear() < 1 || moment.getYear() > 9999) {
      return null;
    }
    return String.format(
        "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
        moment.getYear(),
        moment.getMonthValue(),
        moment.getDayOfMonth(),
        moment.getHour(),
        moment.getMinute(),
        moment.getSecond(),
        moment.getNano() / 1_000_000);
  }

  private static int setting(scala.collection.immutable.Map<String, String> settings, String key, int otherwise) {
    Option<String> value = settings.get(key);
    return value.isDefined() ? Integer.parseInt(value.get().trim()) : otherwise;
  }

  /**
   * Writes {@code rows} (a local relation, or one coalesced to a single partition) as one file of the table of
   * {@code txn}, in the table's folder, and marks the transaction as having written (as Delta's writer does, with its
   * auto-compaction hook registered). Null when the rows or the table are not of the kind this writes.
   */
  private static FewRowsFile write(OptimisticTransaction txn, Dataset<Row> rows) throws Exception {
    LogicalPlan plan = rows.queryExecution().optimizedPlan();
    if (plan instanceof Repartition && ((Repartition) plan).numPartitions() == 1 && !((Repartition) plan).shuffle()) {
      plan = ((Repartition) plan).child();
    }
    if (!(plan instanceof LocalRelation)) {
      return null;
    }
    SparkSession spark = rows.sparkSession();
    Metadata metadata = txn.metadata();
    StructType schema = metadata.schema();
    if (!metadata.partitionColumns().isEmpty()
        || !Constraints$.MODULE$.getAll(metadata, spark).isEmpty()
        || schema.fields().length != plan.output().size()) {
      return null;
    }
    for (StructField field : schema.fields()) {
      if (field.metadata().json().length() > 2 // "{}": generation, identity, mapping, defaults live there
          || !FLAT_TYPES.contains(field.dataType())) { // nested columns' statistics are Delta's own nested maps
        return null;
      }
    }
    List<InternalRow> data = CollectionConverters.asJava(((LocalRelation) plan).data());
    if (data.isEmpty()) {
      return null; // Delta's writer commits no file for no rows
    }

    // Delta's writer: the session's Hadoop settings with the table's properties and the log's options on top.
    Configuration conf = spark.sessionState().newHadoopConfWithOptions(metadata.configuration());
    CollectionConverters.asJava(txn.deltaLog().options()).forEach(conf::set);
    Job job = Job.getInstance(conf);
    job.setOutputKeyClass(Void.class);
    job.setOutputValueClass(InternalRow.class);
    Path folder = txn.deltaLog().dataPath();
    FileOutputFormat.setOutputPath(job, folder);
    FileFormat format = txn.deltaLog().fileFormat(txn.protocol(), metadata);
    scala.collection.immutable.Map<String, String> options =
        scala.collection.immutable.Map$.MODULE$.<String, String>empty().updated("writePartitionColumns", "false");
    OutputWriterFactory factory = format.prepareWrite(spark, job, options, schema);

    Configuration taskConf = job.getConfiguration();
    JobID jobId = new JobID("streamproof", 0);
    TaskAttemptID attempt = new TaskAttemptID(new TaskID(jobId, TaskType.MAP, 0), 0);
    taskConf.set("mapreduce.job.id", jobId.toString());
    taskConf.set("mapreduce.task.id", attempt.getTaskID().toString());
    taskConf.set("mapreduce.task.attempt.id", attempt.toString());
    taskConf.setBoolean("mapreduce.task.ismap", true);
    taskConf.setInt("mapreduce.task.partition", 0);
    TaskAttemptContext context = new TaskAttemptContextImpl(taskConf, attempt);
    String name = "part-00000-" + UUID.randomUUID() + "-c000" + factory.getFileExtension(context);
    Path path = new Path(folder, name);

    txn.hasWritten_$eq(true);
    StructField[] fields = schema.fields();
    long[] nullCounts = new long[fields.length];
    Object[] minValues = new Object[fields.length];
    Object[] maxValues = new Object[fields.length];
    long[] longestStrings = new long[fields.length];
    OutputWriter writer = factory.newInstance(path.toString(), schema, context);
    try {
      try {
        for (InternalRow row : data) {
          writer.write(row);
          for (int i = 0; i < fields.length; i++) {
            gather(row, i, fields[i].dataType(), nullCounts, minValues, maxValues, longestStrings);
          }
        }
      } finally {
        writer.close();
      }
    } catch (Exception failed) {
      try {
        path.getFileSystem(taskConf).delete(path, false); // no partial file left in the table's folder
      } catch (Exception alsoFailed) {
        failed.addSuppressed(alsoFailed);
      }
      throw failed;
    }
    FileStatus status = path.getFileSystem(taskConf).getFileStatus(path);
    txn.registerPostCommitHook(org.apache.spark.sql.delta.hooks.AutoCompact$.MODULE$);
    if (spark.sessionState().conf().getConfString("spark.databricks.delta.history.metricsEnabled", "true")
        .equals("true")) { // the figures Delta's writer gives the commit (DESCRIBE HISTORY's operationMetrics)
      SparkContext sparkContext = spark.sparkContext();
      SQLMetric files = SQLMetrics.createMetric(sparkContext, "number of written files");
      SQLMetric rowsOut = SQLMetrics.createMetric(sparkContext, "number of output rows");
      SQLMetric bytes = SQLMetrics.createSizeMetric(sparkContext, "written output", -1L);
      files.set(1L);
      rowsOut.set((long) data.size());
      bytes.set(status.getLen());
      java.util.Map<String, SQLMetric> metrics = new java.util.HashMap<>();
      metrics.put("numFiles", files);
      metrics.put("numOutputRows", rowsOut);
      metrics.put("numOutputBytes", bytes);
      txn.registerSQLMetrics(spark, scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(metrics)));
    }
    return new FewRowsFile(
        name,
        status.getLen(),
        status.getModificationTime(),
        data.size(),
        nullCounts,
        minValues,
        maxValues,
        longestStrings);
  }

  private static void gather(
      InternalRow row,
      int i,
      DataType type,
      long[] nullCounts,
      Object[] minValues,
      Object[] maxValues,
      long[] longestStrings) {
    if (row.isNullAt(i)) {
      nullCounts[i]++;
      return;
    }
    if (type.equals(DataTypes.StringType)) {
      UTF8String value = row.getUTF8String(i);
      longestStrings[i] = Math.max(longestStrings[i], value.numChars());
      String text = value.toString();
      // Spark's string order is the UTF-8 bytes' (UTF8String.compareTo), as Delta's statistics are.
      if (minValues[i] == null || UTF8String.fromString((String) minValues[i]).compareTo(value) > 0) {
        minValues[i] = text;
      }
      if (maxValues[i] == null || UTF8String.fromString((String) maxValues[i]).compareTo(value) < 0) {
        maxValues[i] = text;
      }
      return;
    }
    long value;
    if (type.equals(DataTypes.IntegerType)) {
      value = row.getInt(i);
    } else if (type.equals(DataTypes.LongType) || type.equals(DataTypes.TimestampType)) {
      value = row.getLong(i);
    } else {
      return; // no bounds kept for this type
    }
    if (minValues[i] == null || (Long) minValues[i] > value) {
      minValues[i] = value;
    }
    if (maxValues[i] == null || (Long) maxValues[i] < value) {
      maxValues[i] = value;
    }
  }
}
