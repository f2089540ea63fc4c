package dev.streamproof.fs;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's checksummed local file system ({@code fs.file.impl}) over {@link ForklessRawLocalFileSystem}: Spark's and
 * Delta's files on the local disk written without a {@code chmod} process each. Set by streamproof's session
 * ({@code streamproof.jvm.session}).
 */
public class ForklessLocalFileSystem extends LocalFileSystem {
  public ForklessLocalFileSystem() {
    super(new ForklessRawLocalFileSystem());
  }
}
