// The chain the Java tests look for: main -> settle -> reconcile ->
// accumulate, busy in accumulate. Run with an argument of seconds (0: until
// killed). Static methods: C1 inlines reconcile into settle, C2 inlines the
// whole chain into settle, so compiled frames take their debug scopes.
public final class Chain {
    static volatile long sink;

    static long accumulate(long seed) {
        long total = seed;
        for (int i = 0; i < 2000; i++) {
            total = total * 6364136223846793005L + 1442695040888963407L; // line: accumulate
            total ^= total >>> 29;
        }
        return total;
    }

    static long reconcile(long seed) {
        long total = 0;
        for (int i = 0; i < 16; i++) {
            total += accumulate(seed + i); // line: reconcile
        }
        return total;
    }

    static long settle(long seed) {
        long total = 0;
        for (int i = 0; i < 4; i++) {
            total ^= reconcile(seed * 31 + i); // line: settle
        }
        return total;
    }

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 0;
        long deadline = seconds > 0 ? System.nanoTime() + seconds * 1_000_000_000L : Long.MAX_VALUE;
        long seed = 1;
        while (System.nanoTime() < deadline) {
            seed = settle(seed); // line: main
            sink = seed;
        }
    }
}
