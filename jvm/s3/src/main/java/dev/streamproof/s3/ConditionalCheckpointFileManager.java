package dev.streamproof.s3;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

/**
 * Spark's checkpoint on S3 without rename: an offset or commit log entry ({@code createAtomic(path, false)}) is
 * created by the store only if absent ({@link ConditionalCreate}), so a second query started on the checkpoint by
 * mistake cannot write the same batch's entry: its write fails with {@link FileAlreadyExistsException}, which Spark
 * reports as a concurrent update of the log. An S3 object is never visible in part, so no temporary file and rename
 * are needed; an entry written whole with {@code overwrite} is a plain PUT. Other file systems than s3a keep Spark's
 * own manager.
 *
 * <p>Plugged in with {@code spark.sql.streaming.checkpointFileManagerClass}.
 */
public class ConditionalCheckpointFileManager implements CheckpointFileManager {
  private final Path path;
  private final FileSystem fs;
  private final CheckpointFileManager others;

  public ConditionalCheckpointFileManager(Path path, Configuration conf) throws IOException {
    this.path = path;
    this.fs = path.getFileSystem(conf);
    this.others = "s3a".equals(fs.getScheme()) ? null : new FileContextBasedCheckpointFileManager(path, conf);
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path target, boolean overwriteIfPossible) {
    if (others != null) {
      return others.createAtomic(target, overwriteIfPossible);
    }
    try {
      if (overwriteIfPossible) {
        return new Overwritten(fs.create(target, true));
      }
      return new Created(fs, target);
    } catch (IOException error) {
      throw unchecked(error);
    }
  }

  /** A whole entry written with overwrite: a plain PUT at close. */
  private static final class Overwritten extends CancellableFSDataOutputStream {
    private final FSDataOutputStream out;

    Overwritten(FSDataOutputStream out) {
      super(out);
      this.out = out;
    }

    @Override
    public void cancel() {
      out.abort();
    }
  }

  /**
   * An entry kept in memory (offsets and commits are small) and created at close by {@link
   * ConditionalCreate#createOrAccept}: a refusal by the store becomes Spark's "already exists"; our own PUT retried
   * after a lost answer is accepted; a 409 is tried again.
   */
  private static final class Created extends CancellableFSDataOutputStream {
    private final FileSystem fs;
    private final Path target;
    private final ByteArrayOutputStream bytes;
    private boolean done;

    Created(FileSystem fs, Path target) {
      this(fs, target, new ByteArrayOutputStream());
    }

    private Created(FileSystem fs, Path target, ByteArrayOutputStream bytes) {
      super(bytes);
      this.fs = fs;
      this.target = target;
      this.bytes = bytes;
    }

    @Override
    public void close() throws IOException {
      if (done) {
        return;
      }
      done = true;
      super.close();
      IOException refused = ConditionalCreate.createOrAccept(fs, target, bytes.toByteArray());
      if (refused != null) {
        FileAlreadyExistsException exists = new FileAlreadyExistsException(target.toString());
        exists.initCause(refused);
        throw exists;
      }
    }

    @Override
    public void cancel() {
      done = true; // nothing was sent: the object never appears
    }
  }

  @Override
  public FSDataInputStream open(Path file) {
    try {
      return fs.open(file);
    } catch (IOException error) {
      throw unchecked(error);
    }
  }

  @Override
  public FileStatus[] list(Path folder, PathFilter filter) {
    try {
      return fs.listStatus(folder, filter);
    } catch (java.io.FileNotFoundException gone) {
      return new FileStatus[0];
    } catch (IOException error) {
      throw unchecked(error);
    }
  }

  @Override
  public void mkdirs(Path folder) {
    try {
      fs.mkdirs(folder);
    } catch (IOException error) {
      throw unchecked(error);
    }
  }

  @Override
  public boolean exists(Path file) {
    try {
      return fs.exists(file);
    } catch (IOException error) {
      throw unchecked(error);
    }
  }

  @Override
  public void delete(Path file) {
    try {
      fs.delete(file, true);
    } catch (IOException error) {
      throw unchecked(error);
    }
  }

  @Override
  public boolean isLocal() {
    return false;
  }

  @Override
  public Path createCheckpointDirectory() {
    Path qualified = fs.makeQualified(path);
    mkdirs(qualified);
    return qualified;
  }

  /**
   * Throws {@code error} as it is: Spark's callers (Scala) catch {@code FileNotFoundException} and other I/O errors by
   * type, which a wrapper would hide; the interface declares none.
   */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException unchecked(Throwable error) throws E {
    throw (E) error;
  }
}
