package dev.streamproof.s3;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Arrays;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A file created only if absent, by the object store itself: S3A's conditional create (HADOOP-19256, Hadoop 3.4.2+),
 * a PUT with {@code If-None-Match: *} sent when the stream closes. Of two writers of one key exactly one wins; the
 * other's close fails with HTTP 412, which {@link #lostTheRace} recognises.
 */
final class ConditionalCreate {
  /** Hadoop's option for a create that fails when the file exists, checked by the store (not by a HEAD before). */
  static final String IF_NONE_MATCH = "fs.option.create.conditional.overwrite";

  private ConditionalCreate() {}

  /** A stream whose close creates {@code path} only if no object is there. */
  static FSDataOutputStream open(FileSystem fs, Path path) throws IOException {
    // The builder's generic self type is lost along the chain (a raw FSDataOutputStreamBuilder): its build() is one.
    return (FSDataOutputStream) fs.createFile(path).create().overwrite(false).must(IF_NONE_MATCH, true).build();
  }

  /** S3A's exception for an HTTP 412: the object exists. */
  static final String REMOTE_FILE_CHANGED = "org.apache.hadoop.fs.s3a.RemoteFileChangedException";
  /** A 409 (two conditional writes of one key in flight: the store decided nothing) is tried again this often. */
  static final int CONFLICT_RETRIES = 5;

  /**
   * Creates {@code path} holding {@code bytes} only if absent; returns null when created, else the store's refusal (the
   * object exists), which each caller turns into the "already exists" its caller expects (Spark's is Hadoop's, Delta's
   * is java.nio's). A 412 that answers our own PUT, retried after its first answer was lost, finds the object holding
   * exactly our bytes: the create is ours. A 409 is tried again.
   */
  static IOException createOrAccept(FileSystem fs, Path path, byte[] bytes) throws IOException {
    for (int attempt = 0; ; attempt++) {
      try {
        FSDataOutputStream out = open(fs, path);
        out.write(bytes);
        out.close();
        return null;
      } catch (IOException error) {
        if (status(error) == 409 && attempt < CONFLICT_RETRIES) {
          System.err.println("[streamproof] " + path + ": the store answered 409 (another conditional write in "
              + "flight); retrying");
          pause(200L * (attempt + 1));
          continue;
        }
        if (!lostTheRace(error)) {
          throw error;
        }
        if (Arrays.equals(readOrNull(fs, path), bytes)) {
          return null; // our own PUT, retried after its answer was lost
        }
        return error;
      }
    }
  }

  /**
   * Whether {@code error} says the store refused the create because the object exists: S3A's class for a 412, or a
   * cause whose HTTP status is 412. Never its text: a message holds paths and object names full of numbers.
   */
  static boolean lostTheRace(Throwable error) {
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      if (isA(cause.getClass(), REMOTE_FILE_CHANGED) || statusOf(cause) == 412) {
        return true;
      }
    }
    return false;
  }

  /** The first HTTP status among {@code error} and its causes, -1 when none carries one. */
  static int status(Throwable error) {
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      int status = statusOf(cause);
      if (status >= 0) {
        return status;
      }
    }
    return -1;
  }

  /** The AWS SDK's and S3A's {@code statusCode()} (read by reflection: no compile-time AWS dependency), else -1. */
  private static int statusOf(Throwable error) {
    try {
      Object status = error.getClass().getMethod("statusCode").invoke(error);
      return status instanceof Integer ? (Integer) status : -1;
    } catch (ReflectiveOperationException | RuntimeException notOne) {
      return -1;
    }
  }

  private static boolean isA(Class<?> type, String name) {
    for (Class<?> c = type; c != null; c = c.getSuperclass()) {
      if (c.getName().equals(name)) {
        return true;
      }
    }
    return false;
  }

  private static byte[] readOrNull(FileSystem fs, Path path) throws IOException {
    try {
      return read(fs, path);
    } catch (java.io.FileNotFoundException gone) {
      return null;
    }
  }

  private static void pause(long millis) throws IOException {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException interrupted) {
      Thread.currentThread().interrupt();
      throw new java.io.InterruptedIOException("interrupted while retrying a conditional create");
    }
  }

  /** The bytes of {@code path} as the store holds them. */
  static byte[] read(FileSystem fs, Path path) throws IOException {
    try (InputStream in = fs.open(path)) {
      ByteArrayOutputStream out = new ByteArrayOutputStream();
      in.transferTo(out);
      return out.toByteArray();
    }
  }
}
