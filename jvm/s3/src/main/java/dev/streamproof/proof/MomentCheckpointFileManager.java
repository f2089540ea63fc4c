package dev.streamproof.proof;

import dev.streamproof.s3.ConditionalCheckpointFileManager;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardOpenOption;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's own checkpoint manager, with the moments of a micro-batch made visible to streamproof's proof of a job.
 *
 * <p>Spark writes, for batch {@code b}, {@code offsets/b} before the sink's write, {@code commits/b} right after the
 * sink's {@code addBatch} returned, and a file sink writes {@code _spark_metadata/b} (its commit) after its files. Each
 * is one {@link #createAtomic} here. The proof arms the entries it wants to stop at, in the system property {@link
 * #ARMED}: comma-separated {@code <action>:<phase>:<path>}, with action {@code block} (the batch's thread stops there
 * for good: the harness SIGKILLs the process tree while nothing else of the query moves) or {@code signal} (it goes
 * on), and phase {@code before} (the entry not created yet) or {@code after} (closed: durable). Reaching one writes
 * {@code reached-<n>} into the folder named by {@link #MARKERS}, which the driver's Python watches. Nothing is armed
 * outside a proof, and the entries are written exactly as Spark's own manager writes them (this delegates to it).
 *
 * <p>Plugged in with {@code spark.sql.streaming.checkpointFileManagerClass}.
 */
public class MomentCheckpointFileManager implements CheckpointFileManager {
  public static final String ARMED = "streamproof.moments.armed";
  public static final String MARKERS = "streamproof.moments.markers";
  private static final long BLOCK_MILLIS = 600_000L;

  private final CheckpointFileManager inner;

  public MomentCheckpointFileManager(Path path, Configuration conf) throws IOException {
    String scheme = path.getFileSystem(conf).getScheme();
    this.inner = "s3a".equals(scheme) ? new ConditionalCheckpointFileManager(path, conf) : spark(path, conf);
  }

  /** What Spark's own {@code CheckpointFileManager.create} picks when no class is configured. */
  private static CheckpointFileManager spark(Path path, Configuration conf) {
    try {
      return new FileContextBasedCheckpointFileManager(path, conf);
    } catch (Exception unsupported) { // Scala throws UnsupportedFileSystemException undeclared, as Spark's own create catches it
      return new FileSystemBasedCheckpointFileManager(path, conf);
    }
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path target, boolean overwriteIfPossible) {
    reach("before", target);
    CancellableFSDataOutputStream out = inner.createAtomic(target, overwriteIfPossible);
    return new Watched(out, target);
  }

  /** Closing the entry makes it durable: the {@code after} moment. */
  private static final class Watched extends CancellableFSDataOutputStream {
    private final CancellableFSDataOutputStream out;
    private final Path target;
    private boolean closed;

    Watched(CancellableFSDataOutputStream out, Path target) {
      super(out);
      this.out = out;
      this.target = target;
    }

    @Override
    public void close() throws IOException {
      if (closed) {
        return;
      }
      closed = true;
      out.close();
      reach("after", target);
    }

    @Override
    public void cancel() {
      closed = true;
      out.cancel();
    }
  }

  /** Stop or signal here when {@code phase} of {@code target} is armed. */
  static void reach(String phase, Path target) {
    String armed = System.getProperty(ARMED, "");
    if (armed.isEmpty()) {
      return;
    }
    String here = target.toUri().getPath();
    int index = 0;
    for (String entry : armed.split(",")) {
      index++;
      String[] parts = entry.split(":", 3);
      if (parts.length != 3 || !parts[1].equals(phase)) {
        continue;
      }
      String path = new Path(parts[2]).toUri().getPath();
      if (!here.equals(path) && !here.equals(path + ".compact")) {
        continue;
      }
      marker(index, phase, here);
      if ("block".equals(parts[0])) {
        block(here);
      }
    }
  }

  private static void marker(int index, String phase, String path) {
    String folder = System.getProperty(MARKERS);
    if (folder == null) {
      return;
    }
    try {
      java.nio.file.Path dir = java.nio.file.Paths.get(folder);
      Files.createDirectories(dir);
      java.nio.file.Path partial = dir.resolve(".reached-" + index);
      Files.write(
          partial,
          (phase + " " + path + "\n").getBytes(StandardCharsets.UTF_8),
          StandardOpenOption.CREATE,
          StandardOpenOption.TRUNCATE_EXISTING);
      Files.move(partial, dir.resolve("reached-" + index), java.nio.file.StandardCopyOption.ATOMIC_MOVE);
    } catch (IOException error) {
      throw new java.io.UncheckedIOException(error);
    }
  }

  /** The batch's thread waits here for the SIGKILL; a proof that never comes fails the batch, never lets it on. */
  private static void block(String path) {
    long until = System.currentTimeMillis() + BLOCK_MILLIS;
    while (System.currentTimeMillis() < until) {
      try {
        Thread.sleep(1000);
      } catch (InterruptedException interrupted) {
        Thread.currentThread().interrupt();
        break;
      }
    }
    throw new IllegalStateException("streamproof: the crash armed at " + path + " was never taken");
  }

  @Override
  public FSDataInputStream open(Path file) {
    return inner.open(file);
  }

  @Override
  public FileStatus[] list(Path folder, PathFilter filter) {
    return inner.list(folder, filter);
  }

  @Override
  public void mkdirs(Path folder) {
    inner.mkdirs(folder);
  }

  @Override
  public boolean exists(Path file) {
    return inner.exists(file);
  }

  @Override
  public void delete(Path file) {
    inner.delete(file);
  }

  @Override
  public boolean isLocal() {
    return inner.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    return inner.createCheckpointDirectory();
  }

  @Override
  public void close() {
    inner.close();
  }
}
