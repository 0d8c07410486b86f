// The Java bench's fixed-work workload (`cargo xtask bench --java`): Chain's
// chain on one thread, in batches of a given number of iterations, so the
// CPU a profiler adds to the same work can be measured. It warms up (C2
// compiles the chain), says "ready", then for each line "N" read on stdin
// runs N iterations and says "done"; it is idle in between, leaving
// the other CPUs to whatever samples it.
import java.io.BufferedReader;
import java.io.InputStreamReader;

public final class ChainWork {
    public static void main(String[] args) throws Exception {
        long warmup = args.length > 0 ? Long.parseLong(args[0]) : 5;
        long deadline = System.nanoTime() + warmup * 1_000_000_000L;
        long seed = 1;
        while (System.nanoTime() < deadline) {
            seed = Chain.settle(seed);
        }
        Chain.sink = seed;
        System.out.println("ready");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            long iterations = Long.parseLong(line.trim());
            for (long done = 0; done < iterations; done++) {
                seed = Chain.settle(seed);
            }
            Chain.sink = seed;
            System.out.println("done");
            System.out.flush();
        }
    }
}
