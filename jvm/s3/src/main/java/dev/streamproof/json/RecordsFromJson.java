package dev.streamproof.json;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import java.io.Serializable;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.ExprUtils$;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.catalyst.json.CreateJacksonParser$;
import org.apache.spark.sql.catalyst.json.JSONOptions;
import org.apache.spark.sql.catalyst.json.JacksonParser;
import org.apache.spark.sql.catalyst.json.JacksonParser$;
import org.apache.spark.sql.catalyst.util.BadRecordException;
import org.apache.spark.sql.catalyst.util.FailureSafeParser;
import org.apache.spark.sql.catalyst.util.ParseMode;
import org.apache.spark.sql.catalyst.util.PermissiveMode$;
import org.apache.spark.sql.classic.ExpressionUtils;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.internal.SQLConf$;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.sql.types.StringType$;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Function1;
import scala.Function2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Spark's {@code from_json} in PERMISSIVE mode, for a struct schema, with Jackson reading a record's UTF-8 bytes
 * in place.
 *
 * <p>Spark's own {@code from_json} hands every record to Jackson through an {@code InputStreamReader}
 * ({@code CreateJacksonParser.utf8String}), which allocates an 8 KB buffer for each record and decodes the bytes to
 * characters before Jackson reads them: in a drain of the bench topic that was 13 of the 37 GB the JVM allocated.
 * Here Jackson reads the bytes themselves (its UTF-8 parser), through the same {@code JacksonParser},
 * {@code JSONOptions} and {@code FailureSafeParser} as {@code from_json}, so a record gives the same row, the same
 * nulls and the same corrupt-record column. A record Jackson could read differently from bytes goes Spark's own way:
 * one that is not valid UTF-8 (the reader replaces bad bytes, the byte parser refuses them), empty, starting with a
 * byte-order mark's first byte or holding a zero byte in its first four (where Jackson's byte parser looks for
 * UTF-16 and UTF-32), or with 150 colons or more (the character parser's guard against names sharing a hash); so
 * does every record under {@code allowUnquotedFieldNames} or {@code allowBackslashEscapingAnyCharacter}, which the
 * two parsers read differently. A record the byte parser refuses is read again Spark's way: it refuses a few the
 * character parser reads (a lone surrogate escaped in a field name, a name of over 50,000 bytes but not characters).
 * Left as it is: the character parser's guard also counts names of earlier records of the task, so a record of
 * under 150 names could be refused by Spark's own {@code from_json} after enough records of names sharing its hash.
 *
 * <p>Python builds the column with {@link #column}: {@code streamproof.transform.records.parse_records}.
 */
public final class RecordsFromJson implements Serializable {
  private static final long serialVersionUID = 1L;

  private final scala.collection.immutable.Map<String, String> options;
  private final StructType schema;
  private final String timeZone;
  private final String corruptRecordDefault;
  private transient FailureSafeParser<UTF8String> parser;

  public RecordsFromJson(
      java.util.Map<String, String> options, StructType schema, String timeZone, String corruptRecordDefault) {
    this.options = scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(options));
    this.schema = schema;
    this.timeZone = timeZone;
    this.corruptRecordDefault = corruptRecordDefault;
  }

  /**
   * The column {@code from_json(text, ddl, options)} gives (PERMISSIVE), read this way: an {@code Invoke} of
   * {@link #evaluate} on this object, as Spark's own {@code from_json} is an {@code Invoke} of its evaluator.
   */
  public static Column column(
      Column text, String ddl, java.util.Map<String, String> options, String timeZone, String corruptRecordDefault) {
    StructType schema = StructType.fromDDL(ddl).asNullable();
    RecordsFromJson evaluator = new RecordsFromJson(options, schema, timeZone, corruptRecordDefault);
    Expression target = Literal.create(evaluator, new ObjectType(RecordsFromJson.class));
    List<Expression> arguments = List.of(ExpressionUtils.expression(text));
    List<AbstractDataType> inputTypes = List.of(StringType$.MODULE$);
    Invoke invoke = new Invoke(
        target,
        "evaluate",
        schema,
        CollectionConverters.asScala(arguments).toSeq(),
        CollectionConverters.asScala(inputTypes).toSeq(),
        true,
        true,
        true);
    return ExpressionUtils.column(invoke);
  }

  /** The record's row; a record that is not JSON of the schema is a row with only the corrupt-record column set. */
  public InternalRow evaluate(UTF8String text) {
    if (parser == null) {
      parser = failureSafeParser();
    }
    Iterator<InternalRow> rows = parser.parse(text);
    return rows.hasNext() ? rows.next() : null;
  }

  private FailureSafeParser<UTF8String> failureSafeParser() {
    // As Spark's JsonToStructsEvaluator builds its parser (Spark 4.2), with the byte reader below.
    JSONOptions parsed = new JSONOptions(options, timeZone, corruptRecordDefault);
    ParseMode mode = parsed.parseMode();
    if (mode != PermissiveMode$.MODULE$) {
      throw new IllegalArgumentException("RecordsFromJson reads in PERMISSIVE mode only, not " + mode.name());
    }
    String corrupt = parsed.columnNameOfCorruptRecord();
    ExprUtils$.MODULE$.verifyColumnNameOfCorruptRecord(schema, corrupt);
    StructType fields = new StructType(
        Arrays.stream(schema.fields()).filter(f -> !f.name().equals(corrupt)).toArray(StructField[]::new));
    JacksonParser raw = SQLConf$.MODULE$.withExistingConf(
        withoutExactStrings(),
        () -> new JacksonParser(fields, parsed, false, JacksonParser$.MODULE$.$lessinit$greater$default$4()));
    Function1<UTF8String, UTF8String> itself = record -> record;
    Function2<JsonFactory, UTF8String, JsonParser> sparks = CreateJacksonParser$.MODULE$::utf8String;
    // Jackson's byte parser refuses a few records its character parser reads (a lone surrogate escaped in a field
    // name, a name of over 50,000 bytes but not characters), and reads records Spark cannot under two options.
    boolean bytesAllowed = !parsed.allowUnquotedFieldNames() && !parsed.allowBackslashEscapingAnyCharacter();
    Function2<JsonFactory, UTF8String, JsonParser> bytes = RecordsFromJson::bytesParser;
    Function1<UTF8String, scala.collection.Iterable<InternalRow>> read = record -> {
      if (!bytesAllowed || !readAsBytes(record)) {
        return raw.parse(record, sparks, itself);
      }
      try {
        return raw.parse(record, bytes, itself);
      } catch (Exception refused) { // a BadRecordException (Scala declares none): read again Spark's way
        if (!(refused instanceof BadRecordException)) {
          throw RecordsFromJson.<RuntimeException>rethrow(refused);
        }
        return raw.parse(record, sparks, itself);
      }
    };
    return new FailureSafeParser<>(read, mode, schema, corrupt);
  }

  /**
   * The task's SQL settings with Spark's exact string parsing off. With it on (Spark's default), a JSON object or
   * array read into a string field is cut from the record as written when Jackson reads bytes, and written out anew
   * (compact) when it reads characters, as it does in {@code from_json}: off, ours writes it out anew too.
   */
  private static SQLConf withoutExactStrings() {
    SQLConf conf = new SQLConf();
    CollectionConverters.asJava(SQLConf$.MODULE$.get().getAllConfs()).forEach(conf::setConfString);
    conf.setConfString(SQLConf$.MODULE$.JSON_EXACT_STRING_PARSING().key(), "false");
    return conf;
  }

  private static JsonParser bytesParser(JsonFactory factory, UTF8String record) {
    try {
      int offset = Math.toIntExact(record.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET);
      return factory.createParser((byte[]) record.getBaseObject(), offset, record.numBytes());
    } catch (java.io.IOException e) {
      throw RecordsFromJson.<RuntimeException>rethrow(e); // as Spark's (Scala) parser factory throws it
    }
  }

  /**
   * True when Jackson reading the record's bytes gives what it gives reading the characters Spark's reader decodes,
   * or refuses the record (then read again Spark's way).
   */
  static boolean readAsBytes(UTF8String record) {
    int length = record.numBytes();
    Object base = record.getBaseObject();
    if (length == 0 || !(base instanceof byte[])) {
      return false;
    }
    long offset = record.getBaseOffset();
    byte first = Platform.getByte(base, offset);
    if (first == (byte) 0xEF || first == (byte) 0xFE || first == (byte) 0xFF) {
      return false; // a byte-order mark's first byte (UTF-8, UTF-16): Jackson's byte parser would skip or detect it
    }
    for (int i = 0; i < Math.min(4, length); i++) {
      if (Platform.getByte(base, offset + i) == 0) {
        return false; // Jackson's byte parser takes a zero byte among the first four for UTF-16 or UTF-32
      }
    }
    // Jackson's character parser refuses an object once 150 of its names share a hash (a guard its byte parser
    // keeps only for tables of over 1,024 names): a record that could have 150 names goes Spark's way.
    int colons = 0;
    boolean ascii = true;
    for (int i = 0; i < length; i++) {
      byte b = Platform.getByte(base, offset + i);
      if (b == ':' && ++colons >= 150) {
        return false;
      }
      ascii &= b >= 0;
    }
    return ascii || record.isValid(); // valid UTF-8 reads the same either way; invalid goes Spark's way
  }

  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E rethrow(Throwable e) throws E {
    throw (E) e;
  }

  @Override
  public boolean equals(Object other) {
    if (!(other instanceof RecordsFromJson)) {
      return false;
    }
    RecordsFromJson that = (RecordsFromJson) other;
    return options.equals(that.options)
        && schema.equals(that.schema)
        && Objects.equals(timeZone, that.timeZone)
        && Objects.equals(corruptRecordDefault, that.corruptRecordDefault);
  }

  @Override
  public int hashCode() {
    return Objects.hash(options, schema, timeZone, corruptRecordDefault);
  }

  @Override
  public String toString() {
    return "RecordsFromJson(" + schema.simpleString() + ")";
  }
}
