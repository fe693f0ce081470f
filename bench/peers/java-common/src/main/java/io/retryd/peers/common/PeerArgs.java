package io.retryd.peers.common;

import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;

/**
 * The command line both peers share, so the Python harness drives them the same way:
 * {@code --bootstrap B --topic T --group G --count N --shape {success,keyed,retry}
 * [--concurrency K] [--handler-ms-max M] [--retry-delay-ms D] [--warm-from W] [--timeout-s S]
 * --out result.json}. Optional values are null when absent, so a peer can tell a setting it
 * must report as non-default from one left to the library.
 */
public final class PeerArgs {
    private static final Set<String> SHAPES = Set.of("success", "keyed", "retry");
    private static final Set<String> REQUIRED = Set.of("bootstrap", "topic", "group", "count", "shape", "out");
    private static final Set<String> OPTIONAL =
            Set.of("concurrency", "handler-ms-max", "retry-delay-ms", "warm-from", "timeout-s");

    public final String bootstrap;
    public final String topic;
    public final String group;
    public final long count;
    public final String shape;
    public final Path out;
    public final Integer concurrency;
    public final double handlerMsMax;
    public final long retryDelayMs;
    public final Long warmFrom;
    public final long timeoutS;

    private PeerArgs(Map<String, String> v) {
        bootstrap = v.get("bootstrap");
        topic = v.get("topic");
        group = v.get("group");
        count = positiveLong(v, "count");
        shape = v.get("shape");
        if (!SHAPES.contains(shape)) {
            throw new UsageError("--shape must be one of success, keyed, retry (got " + shape + ")");
        }
        out = Path.of(v.get("out"));
        concurrency = v.containsKey("concurrency") ? (int) positiveLong(v, "concurrency") : null;
        handlerMsMax = v.containsKey("handler-ms-max") ? Double.parseDouble(v.get("handler-ms-max")) : 5.0;
        if (handlerMsMax < 0) {
            throw new UsageError("--handler-ms-max must be >= 0");
        }
        retryDelayMs = v.containsKey("retry-delay-ms") ? positiveLong(v, "retry-delay-ms") : 1000L;
        warmFrom = v.containsKey("warm-from") ? positiveLong(v, "warm-from") : null;
        if (warmFrom != null && warmFrom >= count) {
            throw new UsageError("--warm-from must be below --count");
        }
        timeoutS = v.containsKey("timeout-s") ? positiveLong(v, "timeout-s") : 600L;
    }

    /** Parses {@code --name value} pairs; a usage error names the offending flag. */
    public static PeerArgs parse(String[] argv) {
        Map<String, String> values = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            String flag = argv[i];
            if (!flag.startsWith("--") || i + 1 >= argv.length) {
                throw new UsageError("expected --name value pairs, got " + flag);
            }
            String name = flag.substring(2);
            if (!REQUIRED.contains(name) && !OPTIONAL.contains(name)) {
                throw new UsageError("unknown option " + flag);
            }
            values.put(name, argv[i + 1]);
        }
        for (String name : REQUIRED) {
            if (!values.containsKey(name)) {
                throw new UsageError("missing --" + name);
            }
        }
        return new PeerArgs(values);
    }

    private static long positiveLong(Map<String, String> v, String name) {
        try {
            long n = Long.parseLong(v.get(name));
            if (n <= 0) {
                throw new UsageError("--" + name + " must be > 0");
            }
            return n;
        } catch (NumberFormatException e) {
            throw new UsageError("--" + name + " must be an integer (got " + v.get(name) + ")");
        }
    }

    /** A bad command line or a shape the peer does not run: exit status 2. */
    public static final class UsageError extends RuntimeException {
        public UsageError(String message) {
            super(message);
        }
    }
}
