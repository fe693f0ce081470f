package io.retryd.peers.common;

import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Counts handled records from any number of handler threads and takes the wall clock and
 * the process's CPU time (all threads) at the first, the W-th (warm-up end) and the N-th, so
 * that the peers report exactly what retryd's benchmark reports: the time between the first
 * and the last handled record, not JVM start-up or group join.
 */
public final class Meter {
    private final long count;
    private final Long warmFrom;
    private final AtomicLong handled = new AtomicLong();
    private final CountDownLatch done = new CountDownLatch(1);
    private final List<Double> lateness = Collections.synchronizedList(new ArrayList<>());
    private final com.sun.management.OperatingSystemMXBean os =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    private volatile long firstWall, firstCpu, warmWall, warmCpu, lastWall, lastCpu;

    public Meter(long count, Long warmFrom) {
        this.count = count;
        this.warmFrom = warmFrom;
    }

    /** One record handled (its last attempt succeeded): call once per record. */
    public void handled() {
        long n = handled.incrementAndGet();
        if (n == 1) {
            firstCpu = os.getProcessCpuTime();
            firstWall = System.nanoTime();
        }
        if (warmFrom != null && n == warmFrom) {
            warmCpu = os.getProcessCpuTime();
            warmWall = System.nanoTime();
        }
        if (n == count) {
            lastWall = System.nanoTime();
            lastCpu = os.getProcessCpuTime();
            done.countDown();
        }
    }

    /** A retried record's lateness: when its retry reached the listener minus when it was due. */
    public void lateness(double ms) {
        lateness.add(ms);
    }

    public long handledSoFar() {
        return handled.get();
    }

    public boolean await(long timeoutS) throws InterruptedException {
        return done.await(timeoutS, TimeUnit.SECONDS);
    }

    /** The result's measured fields (after {@link #await} returned true). */
    public Map<String, Object> figures() {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("handled", handled.get());
        f.put("wall_s", (lastWall - firstWall) / 1e9);
        f.put("cpu_s", (lastCpu - firstCpu) / 1e9);
        if (warmFrom != null) {
            f.put("warm_from", warmFrom);
            f.put("warm_wall_s", (lastWall - warmWall) / 1e9);
            f.put("warm_cpu_s", (lastCpu - warmCpu) / 1e9);
        }
        List<Double> late;
        synchronized (lateness) {
            late = new ArrayList<>(lateness);
        }
        if (!late.isEmpty()) {
            Collections.sort(late);
            Map<String, Object> l = new LinkedHashMap<>();
            l.put("count", late.size());
            l.put("p50", quantile(late, 0.50));
            l.put("p99", quantile(late, 0.99));
            l.put("max", late.get(late.size() - 1));
            l.put("min", late.get(0));
            f.put("lateness_ms", l);
        }
        return f;
    }

    /** Nearest-rank quantile of sorted values. */
    static double quantile(List<Double> sorted, double q) {
        int rank = (int) Math.ceil(q * sorted.size());
        return sorted.get(Math.max(0, Math.min(sorted.size() - 1, rank - 1)));
    }
}
