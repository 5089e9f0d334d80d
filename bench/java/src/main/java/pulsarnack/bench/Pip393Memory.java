package pulsarnack.bench;

import it.unimi.dsi.fastutil.longs.Long2ObjectAVLTreeMap;
import it.unimi.dsi.fastutil.longs.Long2ObjectMap;
import it.unimi.dsi.fastutil.longs.Long2ObjectMaps;
import it.unimi.dsi.fastutil.longs.Long2ObjectOpenHashMap;
import it.unimi.dsi.fastutil.longs.Long2ObjectSortedMap;
import it.unimi.dsi.fastutil.objects.ObjectIterator;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.math.BigDecimal;
import java.math.BigInteger;
import org.roaringbitmap.longlong.LongConsumer;
import org.roaringbitmap.longlong.Roaring64Bitmap;

/**
 * One case of the PIP-393 memory experiment (TimeBucket blog, seed 001), in a fresh JVM.
 *
 * <p>Structure: {@code Long2ObjectAVLTreeMap<Long2ObjectOpenHashMap<Roaring64Bitmap>>}, bucket key
 * {@code due & (-1L << k)} (floor, as Pulsar) or the next multiple of 2^k (ceil). Ids are generated
 * exactly like {@code pulsar_nack.sweep.workloads.Workload(x, n, entriesPerLedger, nackShare).generate()}.
 *
 * <p>Usage: {@code java -XX:+UseSerialGC -Xmx4g -jar pip393-memory.jar x k n entriesPerLedger
 * nackShare [floor|ceil]}. Prints one JSON object on stdout; diagnostics go to stderr.
 */
public final class Pip393Memory {
  static final long T0_MS = 1_735_689_600_000L;
  static final long FIRST_LEDGER = 10_000L;
  static final long GOLDEN = 0x9E3779B97F4A7C15L;
  static final long MIX1 = 0xBF58476D1CE4E5B9L;
  static final long MIX2 = 0x94D049BB133111EBL;
  static final BigInteger U64_MAX = BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE);

  private Pip393Memory() {}

  /** Same as {@code workloads.splitmix64}: output function of {@code (v + 1) * golden}. */
  static long splitmix64(long v) {
    long z = (v + 1) * GOLDEN;
    z = (z ^ (z >>> 30)) * MIX1;
    z = (z ^ (z >>> 27)) * MIX2;
    return z ^ (z >>> 31);
  }

  /** {@code min(int(share * 2.0**64), 2**64 - 1)} as unsigned 64-bit bits (Python's computation). */
  static long threshold(double share) {
    BigInteger t = new BigDecimal(share * 0x1p64).toBigInteger(); // exact double, truncated like int()
    if (t.compareTo(U64_MAX) > 0) {
      t = U64_MAX;
    }
    return t.longValue(); // low 64 bits = the unsigned value
  }

  /** Stream positions of the first n nacked entries (sparse workloads only). */
  static long[] sparsePositions(int n, long threshold) {
    long[] out = new long[n];
    long j = 0;
    for (int i = 0; i < n; j++) {
      if (Long.compareUnsigned(splitmix64(j), threshold) < 0) {
        out[i++] = j;
      }
    }
    return out;
  }

  static long bucketKey(long due, int k, boolean ceil) {
    long mask = -1L << k;
    return ceil ? (due + ~mask) & mask : due & mask;
  }

  static long usedHeapAfterGc(MemoryMXBean mx) throws InterruptedException {
    long best = Long.MAX_VALUE;
    for (int i = 0; i < 4; i++) {
      System.gc();
      Thread.sleep(20);
      best = Math.min(best, mx.getHeapMemoryUsage().getUsed());
    }
    return best;
  }

  /** Sums drained ids so the JIT cannot drop the iteration. */
  static final class Drain implements LongConsumer {
    long count;
    long sum;

    @Override
    public void accept(long value) {
      count++;
      sum += value;
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 5 || args.length > 6) {
      System.err.println("usage: Pip393Memory x k n entriesPerLedger nackShare [floor|ceil]");
      System.exit(2);
    }
    final int x = Integer.parseInt(args[0]);
    final int k = Integer.parseInt(args[1]);
    final int n = Integer.parseInt(args[2]);
    final long epl = Long.parseLong(args[3]);
    final double share = Double.parseDouble(args[4]);
    final String rounding = args.length > 5 ? args[5] : "floor";
    if (x < 1 || k < 0 || k > 62 || n < 0 || epl < 1 || !(share > 0.0 && share <= 1.0)
        || !(rounding.equals("floor") || rounding.equals("ceil"))) {
      System.err.println("bad arguments");
      System.exit(2);
    }
    final boolean ceil = rounding.equals("ceil");
    final boolean dense = share >= 1.0;
    final long threshold = dense ? -1L : threshold(share);
    MemoryMXBean mx = ManagementFactory.getMemoryMXBean();

    warmUp(); // in its own frame: a dead local of main() would stay reachable while interpreted

    // Baseline before anything of the case exists (the sparse positions are freed before measuring).
    long heapBefore = usedHeapAfterGc(mx);

    // Checksum pass (untimed) + the sparse positions, freed before the retained-heap measurement.
    long[] positions = dense ? null : sparsePositions(n, threshold);
    long sumLedger = 0, sumEntry = 0, sumDue = 0, weightedEntry = 0;
    StringBuilder first = new StringBuilder("[");
    StringBuilder last = new StringBuilder("[");
    for (int i = 0; i < n; i++) {
      long p = dense ? i : positions[i];
      long ledger = p / epl + FIRST_LEDGER;
      long entry = p % epl;
      long due = T0_MS + 1 + i / x;
      sumLedger += ledger;
      sumEntry += entry;
      sumDue += due;
      weightedEntry += (long) (i + 1) * entry;
      if (i < 3) {
        first.append(first.length() > 1 ? "," : "").append('[').append(ledger).append(',')
            .append(entry).append(',').append(due).append(']');
      }
      if (i >= n - 3) {
        last.append(last.length() > 1 ? "," : "").append('[').append(ledger).append(',')
            .append(entry).append(',').append(due).append(']');
      }
    }
    first.append(']');
    last.append(']');
    long lastPosition = n == 0 ? -1 : (dense ? n - 1 : positions[n - 1]);


    // Build: the PIP-393 client's insert path, one computeIfAbsent chain per id.
    Long2ObjectSortedMap<Long2ObjectMap<Roaring64Bitmap>> map = new Long2ObjectAVLTreeMap<>();
    long t0 = System.nanoTime();
    for (int i = 0; i < n; i++) {
      long p = dense ? i : positions[i];
      long ledger = p / epl + FIRST_LEDGER;
      long entry = p % epl;
      long due = T0_MS + 1 + i / x;
      map.computeIfAbsent(bucketKey(due, k, ceil), key -> new Long2ObjectOpenHashMap<>())
          .computeIfAbsent(ledger, key -> new Roaring64Bitmap())
          .addLong(entry);
    }
    long insertNs = System.nanoTime() - t0;
    positions = null;

    long retained = usedHeapAfterGc(mx) - heapBefore;
    long bitmaps = 0, estimate = 0;
    for (Long2ObjectMap<Roaring64Bitmap> m : map.values()) {
      bitmaps += m.size();
      for (Roaring64Bitmap bm : m.values()) {
        estimate += bm.getLongSizeInBytes();
      }
    }
    int buckets = map.size();

    long estimateOpt = 0;
    for (Long2ObjectMap<Roaring64Bitmap> m : map.values()) {
      for (Roaring64Bitmap bm : m.values()) {
        bm.runOptimize();
        estimateOpt += bm.getLongSizeInBytes();
      }
    }
    long retainedOpt = usedHeapAfterGc(mx) - heapBefore;

    // Drain in time order: poll the first bucket, visit every ledger's bitmap and every entry id.
    Drain drain = new Drain();
    long drainedLedgerSum = 0;
    long t1 = System.nanoTime();
    while (!map.isEmpty()) {
      long key = map.firstLongKey();
      Long2ObjectMap<Roaring64Bitmap> ledgers = map.remove(key);
      ObjectIterator<Long2ObjectMap.Entry<Roaring64Bitmap>> it =
          Long2ObjectMaps.fastIterator(ledgers);
      while (it.hasNext()) {
        Long2ObjectMap.Entry<Roaring64Bitmap> e = it.next();
        long before = drain.count;
        e.getValue().forEach(drain);
        drainedLedgerSum += e.getLongKey() * (drain.count - before);
      }
    }
    long drainNs = System.nanoTime() - t1;
    long heapAfterDrain = usedHeapAfterGc(mx);
    if (drain.count != n || drain.sum != sumEntry || drainedLedgerSum != sumLedger) {
      System.err.printf("drain mismatch: count %d/%d sum %d/%d ledgers %d/%d%n", drain.count, n,
          drain.sum, sumEntry, drainedLedgerSum, sumLedger);
      System.exit(3);
    }

    double perId = Math.max(n, 1);
    StringBuilder out = new StringBuilder(1024);
    out.append('{')
        .append("\"x\":").append(x)
        .append(",\"k\":").append(k)
        .append(",\"n\":").append(n)
        .append(",\"entries_per_ledger\":").append(epl)
        .append(",\"nack_share\":").append(share)
        .append(",\"rounding\":\"").append(rounding).append('"')
        .append(",\"buckets\":").append(buckets)
        .append(",\"bitmaps\":").append(bitmaps)
        .append(",\"retained_bytes\":").append(retained)
        .append(",\"retained_bytes_run_optimized\":").append(retainedOpt)
        .append(",\"roaring_estimate_bytes\":").append(estimate)
        .append(",\"roaring_estimate_bytes_run_optimized\":").append(estimateOpt)
        .append(",\"insert_ns_per_id\":").append(insertNs / perId)
        .append(",\"drain_ns_per_id\":").append(drainNs / perId)
        .append(",\"drain_after\":\"runOptimize\"")
        .append(",\"heap_before_bytes\":").append(heapBefore)
        .append(",\"heap_after_drain_bytes\":").append(heapAfterDrain)
        .append(",\"java_version\":\"").append(System.getProperty("java.version")).append('"')
        .append(",\"vm\":\"").append(System.getProperty("java.vm.name")).append(' ')
        .append(System.getProperty("java.vm.version")).append('"')
        .append(",\"gc\":\"").append(gcNames()).append('"')
        .append(",\"max_heap_bytes\":").append(Runtime.getRuntime().maxMemory())
        .append(",\"checksum\":{")
        .append("\"count\":").append(n)
        .append(",\"threshold\":\"").append(dense ? "dense" : Long.toUnsignedString(threshold))
        .append('"')
        .append(",\"last_position\":").append(lastPosition)
        .append(",\"sum_ledger\":\"").append(Long.toUnsignedString(sumLedger)).append('"')
        .append(",\"sum_entry\":\"").append(Long.toUnsignedString(sumEntry)).append('"')
        .append(",\"sum_due\":\"").append(Long.toUnsignedString(sumDue)).append('"')
        .append(",\"weighted_entry\":\"").append(Long.toUnsignedString(weightedEntry)).append('"')
        .append(",\"first\":").append(first)
        .append(",\"last\":").append(last)
        .append("}}");
    System.out.println(out);
  }

  /** Loads and exercises fastutil and Roaring so their static state is not counted as retained. */
  static void warmUp() {
    Long2ObjectSortedMap<Long2ObjectMap<Roaring64Bitmap>> warm = new Long2ObjectAVLTreeMap<>();
    for (long i = 0; i < 100_000; i++) {
      warm.computeIfAbsent(i >> 6, key -> new Long2ObjectOpenHashMap<>())
          .computeIfAbsent(i >> 12, key -> new Roaring64Bitmap())
          .addLong(i);
    }
    for (Long2ObjectMap<Roaring64Bitmap> m : warm.values()) {
      for (Roaring64Bitmap bm : m.values()) {
        bm.runOptimize();
        bm.getLongSizeInBytes();
        bm.forEach(new Drain());
      }
    }
    while (!warm.isEmpty()) {
      warm.remove(warm.firstLongKey());
    }
  }

  static String gcNames() {
    StringBuilder sb = new StringBuilder();
    for (var gc : ManagementFactory.getGarbageCollectorMXBeans()) {
      sb.append(sb.length() > 0 ? "+" : "").append(gc.getName());
    }
    return sb.toString();
  }
}
