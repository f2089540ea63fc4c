package dev.streamproof.fs;

import java.io.File;
import java.io.IOException;
import java.lang.reflect.Field;
import java.nio.file.Files;
import java.nio.file.InvalidPathException;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;
import org.apache.hadoop.util.Shell;

/**
 * Hadoop's raw local file system, without the processes it starts for a file's permissions and links on a machine
 * without Hadoop's native library (pyspark ships none): the same answers, from Java's own file API.
 *
 * <p>Why: Hadoop sets a new file's permissions by running {@code chmod} (every file it creates, and its checksum
 * file) and tells whether a path is a symbolic link by running {@code readlink} (twice in every rename through a
 * {@code FileContext}: Spark's checkpoint logs and Delta's log store rename every file they write). In one process of
 * 80 batches, Hadoop started 5,640 processes: 3,872 {@code readlink} (11-16 ms each, measured) and 1,768 {@code
 * chmod} (3-4 ms); a Delta commit of a few rows took 70 ms, mostly those.
 *
 * <p>What changes: {@link #setPermission} sets the same bits with {@code Files.setPosixFilePermissions} (which follows
 * a symbolic link, as {@code chmod} does); {@link #getFileLinkStatus} reads a link with {@code
 * Files.readSymbolicLink} and, for a path that is not one, returns {@link #getFileStatus} as Hadoop's does when
 * {@code readlink} prints nothing. A symbolic link, a sticky bit, Windows and a machine with the native library go
 * Hadoop's own way. {@code
 * tests/test_session_jars.py::test_local_files_get_hadoop_s_own_permissions_and_link_answers_without_a_process}
 * compares both answers with Hadoop's own class's.
 */
public class ForklessRawLocalFileSystem extends RawLocalFileSystem {
  private static final Field DEPRECATED_FILE_STATUS = deprecatedFileStatusFlag();

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    int mode = permission.toShort();
    if (Shell.WINDOWS || NativeIO.isAvailable() || (mode & ~0777) != 0) {
      super.setPermission(p, permission);
      return;
    }
    // rwxr-xr-x: the nine bits, the sticky one (its tenth) having gone Hadoop's way above
    Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(permission.toString()));
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Shell.WINDOWS || !readsLinksWithShell() || !linkTarget(new File(f.toString())).isEmpty()) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f); // what Hadoop returns when readlink prints nothing: not a link
  }

  /** What {@code readlink FILE} prints, trimmed, or "" when it fails (not a link), as Hadoop's FileUtil.readLink. */
  static String linkTarget(File file) {
    try {
      return Files.readSymbolicLink(file.toPath()).toString().trim();
    } catch (IOException | UnsupportedOperationException | InvalidPathException | SecurityException notALink) {
      return "";
    }
  }

  /**
   * True while Hadoop reads links by running {@code readlink} (its private {@code useDeprecatedFileStatus}, set
   * unless a caller chose Hadoop's {@code stat} way); false when the flag cannot be read: then Hadoop's own way.
   */
  private static boolean readsLinksWithShell() {
    try {
      return DEPRECATED_FILE_STATUS != null && DEPRECATED_FILE_STATUS.getBoolean(null);
    } catch (IllegalAccessException unreadable) {
      return false;
    }
  }

  private static Field deprecatedFileStatusFlag() {
    try {
      Field flag = RawLocalFileSystem.class.getDeclaredField("useDeprecatedFileStatus");
      flag.setAccessible(true);
      return flag;
    } catch (ReflectiveOperationException | RuntimeException missing) {
      return null;
    }
  }
}
