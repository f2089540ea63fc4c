package dev.streamproof.proof;

import dev.streamproof.fs.ForklessLocalFileSystem;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * Hadoop's local file system, where a write task of a job's batch can be held with its first data file open, so that
 * streamproof's proof of a job on a cluster SIGKILLs the executor running it while the write is certainly under way.
 *
 * <p>Without a hold the proof had to catch the write's tasks running from the driver; a batch of a few hundred rows
 * writes in milliseconds, and the kill sometimes found no task left on the executor it killed (no attempt lost: the
 * fault did not happen). Here the proof arms a job group by creating {@code hold-<group>} in the folder named by the
 * Hadoop setting {@link #FOLDER}; the first task of that group to create a data file ({@code part-*}) creates {@code
 * held-<group>} exclusively, writes its executor's pid into it and waits (at most {@link #HOLD_MILLIS}) with the file
 * created and empty. Every other file, task and process is streamproof's local file system ({@code
 * ForklessLocalFileSystem}, as without a hold).
 *
 * <p>Plugged in, on a cluster proof only, with {@code spark.hadoop.fs.file.impl}.
 */
public class HoldingLocalFileSystem extends ForklessLocalFileSystem {
  public static final String FOLDER = "streamproof.hold.folder";
  private static final long HOLD_MILLIS = 120_000L;

  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    FSDataOutputStream out =
        super.create(f, permission, overwrite, bufferSize, replication, blockSize, progress);
    if (f.getName().startsWith("part-")) {
      holdIfArmed();
    }
    return out;
  }

  private void holdIfArmed() throws IOException {
    String folder = getConf() == null ? null : getConf().get(FOLDER);
    String group = folder == null ? null : jobGroupOfThisTask();
    if (group == null || !Files.exists(Paths.get(folder, "hold-" + group))) {
      return;
    }
    try {
      Files.write(
          Paths.get(folder, "held-" + group),
          Long.toString(ProcessHandle.current().pid()).getBytes(StandardCharsets.UTF_8),
          java.nio.file.StandardOpenOption.CREATE_NEW,
          java.nio.file.StandardOpenOption.WRITE);
    } catch (FileAlreadyExistsException taken) {
      return; // another task (or this task's retry) was held already: the fault fires once
    }
    try {
      Thread.sleep(HOLD_MILLIS); // the proof SIGKILLs this JVM long before
    } catch (InterruptedException interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * The job group of the task this thread runs (null outside a task: the driver). Spark's {@code TaskContext} through
   * reflection: the module compiles against spark-sql's API alone.
   */
  private static String jobGroupOfThisTask() {
    try {
      Class<?> taskContext = Class.forName("org.apache.spark.TaskContext");
      Object task = taskContext.getMethod("get").invoke(null);
      return task == null
          ? null
          : (String) taskContext.getMethod("getLocalProperty", String.class).invoke(task, "spark.jobGroup.id");
    } catch (ReflectiveOperationException notInSpark) {
      return null;
    }
  }
}
