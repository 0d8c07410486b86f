// The shapes of Java code the Java tests look for, one mode per run:
//   native         compress with java.util.zip.Deflater in a loop (libzip and
//                  libz native frames above Shapes.compress)
//   threads        three threads named firn-worker-{alpha,beta,gamma}-thread,
//                  each busy in its own method
//   loader DIR GO  a lambda and an inner class on threads of their own; on the
//                  main thread, once the file GO exists: Plugin (from DIR, by
//                  a class loader of its own) for 3 s, then Plugin unloaded and
//                  Other loaded the same way; "unloaded" printed between, and
//                  GO.after created after 3 s of Other
//   churn DIR      Plugin loaded by a new class loader again and again, made
//                  hot (the compiler threads compile it) and dropped among
//                  garbage (the GC threads collect it)
import java.io.File;
import java.lang.ref.WeakReference;
import java.net.URL;
import java.net.URLClassLoader;
import java.util.function.LongUnaryOperator;
import java.util.zip.Deflater;

public final class Shapes {
    static volatile long sink;
    static volatile Object garbage;

    static long compress(Deflater deflater, byte[] input, byte[] output) {
        deflater.reset();
        deflater.setInput(input);
        deflater.finish();
        long total = 0;
        while (!deflater.finished()) {
            total += deflater.deflate(output); // line: compress
        }
        return total;
    }

    static void nativeLoop() {
        byte[] input = new byte[1 << 20];
        long state = 7;
        for (int i = 0; i < input.length; i++) {
            state = state * 6364136223846793005L + 1442695040888963407L;
            // Compressible, yet not trivially: a small alphabet.
            input[i] = (byte) ('a' + ((state >>> 59) & 7));
        }
        byte[] output = new byte[1 << 16];
        Deflater deflater = new Deflater(6);
        while (true) {
            sink = compress(deflater, input, output);
        }
    }

    static long spinAlpha(long seed) {
        long total = seed;
        for (int i = 0; i < 100_000; i++) {
            total = total * 6364136223846793005L + 1442695040888963407L; // line: alpha
        }
        return total;
    }

    static long spinBeta(long seed) {
        long total = seed;
        for (int i = 0; i < 100_000; i++) {
            total = (total ^ (total << 13)) + 0x9E3779B97F4A7C15L; // line: beta
        }
        return total;
    }

    static long spinGamma(long seed) {
        long total = seed;
        for (int i = 0; i < 100_000; i++) {
            total = Long.rotateLeft(total, 7) * 31 + i; // line: gamma
        }
        return total;
    }

    static Thread start(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
        return thread;
    }

    static void threads() throws InterruptedException {
        start("firn-worker-alpha-thread", () -> { while (true) sink = spinAlpha(sink); });
        start("firn-worker-beta-thread", () -> { while (true) sink = spinBeta(sink); });
        start("firn-worker-gamma-thread", () -> { while (true) sink = spinGamma(sink); });
        Thread.sleep(Long.MAX_VALUE);
    }

    final class Inner {
        long work(long seed) {
            long total = seed;
            for (int i = 0; i < 100_000; i++) {
                total = total * 31 + (total >>> 7) + i; // line: inner
            }
            return total;
        }
    }

    static LongUnaryOperator load(File dir, String name) throws Exception {
        URLClassLoader loader = new URLClassLoader(new URL[] {dir.toURI().toURL()}, null);
        return (LongUnaryOperator) loader.loadClass(name).getDeclaredConstructor().newInstance();
    }

    static void runPlugin(LongUnaryOperator plugin, long until) {
        long seed = 1;
        while (System.nanoTime() < until) {
            seed = plugin.applyAsLong(seed); // line: runPlugin
        }
        sink = seed;
    }

    static void runOther(LongUnaryOperator other, long until) {
        long seed = 1;
        while (System.nanoTime() < until) {
            seed = other.applyAsLong(seed); // line: runOther
        }
        sink = seed;
    }

    static WeakReference<ClassLoader> phaseOne(File dir) throws Exception {
        LongUnaryOperator plugin = load(dir, "Plugin");
        runPlugin(plugin, System.nanoTime() + 3_000_000_000L);
        return new WeakReference<>(plugin.getClass().getClassLoader());
    }

    static void loader(File dir, File go) throws Exception {
        start("lambda-thread", () -> {
            long total = 1;
            while (true) {
                for (int i = 0; i < 100_000; i++) {
                    total = total * 17 + (total >>> 3) + i; // line: lambda
                }
                sink = total;
            }
        });
        Shapes outer = new Shapes();
        start("inner-thread", () -> {
            Inner inner = outer.new Inner();
            while (true) sink = inner.work(sink);
        });
        while (!go.exists()) {
            Thread.sleep(10);
        }
        WeakReference<ClassLoader> gone = phaseOne(dir);
        while (gone.get() != null) {
            System.gc();
            Thread.sleep(10);
        }
        System.out.println("unloaded");
        System.out.flush();
        LongUnaryOperator other = load(dir, "Other");
        runOther(other, System.nanoTime() + 3_000_000_000L);
        new File(go.getPath() + ".after").createNewFile();
        runOther(other, Long.MAX_VALUE);
    }

    static void churn(File dir) throws Exception {
        long round = 0;
        while (true) {
            LongUnaryOperator plugin = load(dir, "Plugin");
            long seed = round++;
            for (int i = 0; i < 300; i++) {
                seed = plugin.applyAsLong(seed);
                // Escapes, so the compiler cannot leave it out: work for
                // the GC.
                garbage = new long[1 << 16];
            }
            sink = seed;
        }
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "native" -> nativeLoop();
            case "threads" -> threads();
            case "loader" -> loader(new File(args[1]), new File(args[2]));
            case "churn" -> churn(new File(args[1]));
            default -> throw new IllegalArgumentException(args[0]);
        }
    }
}
