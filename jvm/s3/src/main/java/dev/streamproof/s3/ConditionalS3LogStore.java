package dev.streamproof.s3;

import io.delta.storage.S3SingleDriverLogStore;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log on S3 with many writers and no DynamoDB: {@code _delta_log/<version>.json} is created by the store only
 * if absent ({@link ConditionalCreate}), so of two writers of one version exactly one wins and the other gets
 * {@link FileAlreadyExistsException}, which Delta treats as a conflict to check and retry. Listing is
 * {@link S3SingleDriverLogStore}'s ({@code delta.enableFastS3AListFrom}: from a key, not the whole log).
 *
 * <p>A 412 can also answer our own PUT retried after its first answer was lost: the object is then read back, and
 * holding exactly our bytes, the commit is ours.
 *
 * <p>Plugged in with {@code spark.delta.logStore.s3a.impl=dev.streamproof.s3.ConditionalS3LogStore}.
 */
public class ConditionalS3LogStore extends S3SingleDriverLogStore {
  public ConditionalS3LogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    byte[] bytes = lines(actions);
    if (overwrite) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(bytes);
      }
      return;
    }
    IOException refused = ConditionalCreate.createOrAccept(fs, path, bytes);
    if (refused != null) {
      FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
      exists.initCause(refused);
      throw exists;
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false; // an S3 object is visible whole or not at all
  }

  private static byte[] lines(Iterator<String> actions) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    while (actions.hasNext()) {
      out.writeBytes((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
    }
    return out.toByteArray();
  }
}
