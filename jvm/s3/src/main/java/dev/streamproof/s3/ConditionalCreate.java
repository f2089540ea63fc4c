package dev.streamproof.s3;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
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

  /** Whether {@code error} says the store refused the create because the object exists (HTTP 412). */
  static boolean lostTheRace(Throwable error) {
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      String name = cause.getClass().getName();
      String message = String.valueOf(cause.getMessage());
      if (name.endsWith("RemoteFileChangedException")
          || message.contains("412")
          || message.contains("PreconditionFailed")
          || message.contains("Precondition Failed")) {
        return true;
      }
    }
    return false;
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
