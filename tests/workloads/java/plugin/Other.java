// Loaded by Shapes after Plugin is unloaded.
public final class Other implements java.util.function.LongUnaryOperator {
    @Override
    public long applyAsLong(long seed) {
        long total = seed;
        for (int i = 0; i < 50_000; i++) {
            total = (total ^ (total >>> 11)) * 0x9E3779B97F4A7C15L + i; // line: other
        }
        return total;
    }
}
