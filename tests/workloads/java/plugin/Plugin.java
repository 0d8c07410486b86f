// Loaded by Shapes through a class loader of its own, then unloaded.
public final class Plugin implements java.util.function.LongUnaryOperator {
    @Override
    public long applyAsLong(long seed) {
        long total = seed;
        for (int i = 0; i < 50_000; i++) {
            total = total * 6364136223846793005L + i; // line: plugin
        }
        return total;
    }
}
