package dev.streamproof.json;

import java.util.List;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.classic.ExpressionUtils;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.BooleanType$;
import org.apache.spark.sql.types.StringType$;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Spark's {@code is_valid_utf8(text)}, with text of ASCII bytes alone told eight bytes at a time.
 *
 * <p>Spark's own check ({@code UTF8String.isValid}) looks at one byte at a time, with a table lookup for each: in a
 * Flight Recorder profile of a drain of the bench topic (records of about 200 ASCII bytes) it was the top frame of
 * 7% of the task threads' samples. A record whose bytes are all ASCII is valid UTF-8; any other goes Spark's way.
 *
 * <p>Python builds the column with {@link #column}: {@code streamproof.transform.records.parse_records}.
 */
public final class ValidUtf8 {
  private static final long HIGH_BITS = 0x8080808080808080L;

  private ValidUtf8() {}

  /** The column {@code is_valid_utf8(text)} gives: a {@code StaticInvoke} of {@link #isValid}, null for null. */
  public static Column column(Column text) {
    List<Expression> arguments = List.of(ExpressionUtils.expression(text));
    List<AbstractDataType> inputTypes = List.of(StringType$.MODULE$);
    StaticInvoke invoke = new StaticInvoke(
        ValidUtf8.class,
        BooleanType$.MODULE$,
        "isValid",
        CollectionConverters.asScala(arguments).toSeq(),
        CollectionConverters.asScala(inputTypes).toSeq(),
        true,
        false,
        true,
        Option.empty());
    return ExpressionUtils.column(invoke);
  }

  /** True when the text's bytes are valid UTF-8, as {@code text.isValid()} says. */
  public static boolean isValid(UTF8String text) {
    Object base = text.getBaseObject();
    long offset = text.getBaseOffset();
    int length = text.numBytes();
    int i = 0;
    long seen = 0;
    for (; i + 8 <= length; i += 8) {
      seen |= Platform.getLong(base, offset + i);
    }
    for (; i < length; i++) {
      seen |= Platform.getByte(base, offset + i);
    }
    return (seen & HIGH_BITS) == 0 || text.isValid();
  }
}
