/*
 * Licensed under the Apache License, Version 2.0 (the "License"); see the project's LICENSE.
 */
package io.github.pulsarnack.standalone;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.pulsar.PulsarStandaloneStarter;
import org.apache.pulsar.metadata.api.MetadataStoreConfig;
import org.apache.pulsar.metadata.api.NotificationType;
import org.apache.pulsar.metadata.api.extended.MetadataStoreExtended;

/**
 * Starts {@link PulsarStandaloneStarter} in this JVM, after expiring the ephemeral metadata nodes
 * that a previous, crashed (SIGKILLed) run left in the RocksDB metadata store.
 *
 * <p>Why: with the RocksDB metadata store (the standalone default since Pulsar 2.11) ephemeral
 * nodes have no session that could expire. The store deletes a stale one lazily when it is read,
 * and the Deleted notification reaches the bookie's freshly acquired registration lock on
 * {@code /ledgers/available/<bookie>}, which then deletes and re-creates itself, and each
 * re-creation notifies it again: the bookie flaps between available and gone (observed with Pulsar
 * 4.0.7: up to 100k cycles, "Not enough non-faulty bookies" for minutes). Reading the whole tree
 * once, before anything holds a lock, makes the store delete every stale ephemeral node while
 * nobody listens - what a ZooKeeper session expiry would have done.
 *
 * <p>Arguments are PulsarStandaloneStarter's; only {@code --metadata-dir} is read here.
 */
public final class StandaloneMain {

    private StandaloneMain() {
    }

    public static void main(String[] args) throws Exception {
        expireStaleEphemeralNodes(metadataDir(args));
        PulsarStandaloneStarter.main(args);
    }

    private static Path metadataDir(String[] args) {
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals("--metadata-dir")) {
                return Paths.get(args[i + 1]).toAbsolutePath();
            }
        }
        return Paths.get("data/metadata").toAbsolutePath();
    }

    private static void expireStaleEphemeralNodes(Path dir) throws Exception {
        if (!Files.isDirectory(dir)) {
            return; // first start: nothing stale
        }
        AtomicInteger deleted = new AtomicInteger();
        AtomicLong lastEvent = new AtomicLong(System.nanoTime());
        MetadataStoreConfig config = MetadataStoreConfig.builder()
                .metadataStoreName("pulsar-nack-stale-ephemeral-sweep")
                .build();
        try (MetadataStoreExtended store = MetadataStoreExtended.create("rocksdb://" + dir, config)) {
            store.registerListener(n -> {
                if (n.getType() == NotificationType.Deleted) {
                    deleted.incrementAndGet();
                    lastEvent.set(System.nanoTime());
                }
            });
            // Lists every key of the store; each ephemeral node owned by an earlier instance is
            // deleted on the way.
            store.getChildrenFromStore("/").get(30, TimeUnit.SECONDS);
            long quietNanos = TimeUnit.MILLISECONDS.toNanos(300);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (System.nanoTime() - lastEvent.get() < quietNanos && System.nanoTime() < deadline) {
                Thread.sleep(50);
            }
        }
        if (deleted.get() > 0) {
            System.out.println("pulsar-nack: expired " + deleted.get()
                    + " stale ephemeral metadata node(s) left by an unclean shutdown");
        }
    }
}
