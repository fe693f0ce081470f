package io.retryd.peers.common;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.locks.LockSupport;

/**
 * The run both peers share: parse the command line, start the peer, wait until it handled N
 * records (or the time-out), write the result JSON and exit by itself. Exit status: 0 done,
 * 1 failed or timed out, 2 bad command line or a shape this peer does not run; the reason
 * goes to stderr as one line starting with the peer's name.
 */
public final class PeerMain {
    private PeerMain() {}

    /** One peer: starts consuming in background threads and returns its non-default settings. */
    public interface Peer {
        String system();

        String version();

        Map<String, Object> start(PeerArgs args, Meter meter) throws Exception;
    }

    public static void run(String[] argv, Peer peer) {
        int status;
        try {
            status = runOnce(argv, peer);
        } catch (PeerArgs.UsageError e) {
            System.err.println(peer.system() + ": " + e.getMessage());
            status = 2;
        } catch (Throwable e) {
            System.err.println(peer.system() + ": failed: " + e);
            e.printStackTrace();
            status = 1;
        }
        System.out.flush();
        System.err.flush();
        // The library's threads (consumers, schedulers) are not daemons and a graceful close
        // can take seconds that nobody measures: the result is written, leave now.
        Runtime.getRuntime().halt(status);
    }

    private static int runOnce(String[] argv, Peer peer) throws Exception {
        PeerArgs args = PeerArgs.parse(argv);
        Meter meter = new Meter(args.count, args.warmFrom);
        Map<String, Object> config = peer.start(args, meter);
        if (!meter.await(args.timeoutS)) {
            System.err.printf(
                    "%s: timed out after %d s with %d of %d records handled%n",
                    peer.system(), args.timeoutS, meter.handledSoFar(), args.count);
            return 1;
        }
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("system", peer.system());
        result.put("version", peer.version());
        result.put("shape", args.shape);
        result.put("count", args.count);
        result.put("config", config);
        result.putAll(meter.figures());
        result.put("java", System.getProperty("java.version"));
        Json.write(args.out, result);
        return 0;
    }

    /** The keyed shape's handler: a uniformly random pause of 0..msMax ms (not busy). */
    public static void pauseUpTo(double msMax) {
        long nanos = (long) (ThreadLocalRandom.current().nextDouble() * msMax * 1_000_000);
        long deadline = System.nanoTime() + nanos;
        for (long left = nanos; left > 0; left = deadline - System.nanoTime()) {
            LockSupport.parkNanos(left);
        }
    }
}
