package io.retryd.testing;

import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.sink.SinkConnector;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/**
 * What Kafka's FileStreamSinkConnector does (one line per record value, appended to the file
 * named by "file"), for tests of the Connect runtime itself: connect-file 4.4.0 is not on Maven
 * Central and 4.3's calls a class that moved in 4.4 clients. Conversion, error tolerance and
 * the dead letter queue are the runtime's work (WorkerSinkTask, DeadLetterQueueReporter); a
 * record only reaches put() once its key and value converted.
 */
public class LineFileSinkConnector extends SinkConnector {
    static final String VERSION = "1";
    private Map<String, String> props = Collections.emptyMap();

    @Override
    public String version() {
        return VERSION;
    }

    @Override
    public void start(Map<String, String> props) {
        this.props = props;
    }

    @Override
    public Class<? extends Task> taskClass() {
        return LineFileSinkTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.nCopies(1, props);
    }

    @Override
    public void stop() {}

    @Override
    public ConfigDef config() {
        return new ConfigDef()
                .define("file", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "file to append to");
    }

    /** The task: appends each record's value and a newline, flushed after every batch. */
    public static class LineFileSinkTask extends SinkTask {
        private Writer out;

        @Override
        public String version() {
            return VERSION;
        }

        @Override
        public void start(Map<String, String> props) {
            try {
                out = Files.newBufferedWriter(
                        Path.of(props.get("file")),
                        StandardCharsets.UTF_8,
                        StandardOpenOption.CREATE,
                        StandardOpenOption.APPEND);
            } catch (IOException e) {
                throw new ConnectException("cannot open " + props.get("file"), e);
            }
        }

        @Override
        public void put(Collection<SinkRecord> records) {
            try {
                for (SinkRecord record : records) {
                    out.write(String.valueOf(record.value()));
                    out.write('\n');
                }
                out.flush();
            } catch (IOException e) {
                throw new ConnectException("cannot write", e);
            }
        }

        @Override
        public void stop() {
            try {
                if (out != null) {
                    out.close();
                }
            } catch (IOException e) {
                throw new ConnectException("cannot close", e);
            }
        }
    }
}
