// The Java bench's workload (`cargo xtask bench --java`): Chain's chain
// (main -> settle -> reconcile -> accumulate) run in a loop until killed,
// counted. It says "ready" once warmed up (C2 has compiled the chain), then
// answers each line read on stdin with its iterations and seconds so far.
import java.io.BufferedReader;
import java.io.InputStreamReader;

public final class ChainBench {
    static volatile long iterations;

    public static void main(String[] args) throws Exception {
        long warmup = args.length > 0 ? Long.parseLong(args[0]) : 5;
        long start = System.nanoTime();
        Thread reporter = new Thread(() -> report(start), "reporter");
        reporter.setDaemon(true);
        long ready = start + warmup * 1_000_000_000L;
        long seed = 1;
        long done = 0;
        while (true) {
            seed = Chain.settle(seed);
            Chain.sink = seed;
            iterations = ++done;
            if (ready != 0 && System.nanoTime() >= ready) {
                ready = 0;
                reporter.start();
            }
        }
    }

    static void report(long start) {
        System.out.println("ready");
        System.out.flush();
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
            while (in.readLine() != null) {
                double seconds = (System.nanoTime() - start) / 1e9;
                System.out.println("iterations=" + iterations + " seconds=" + seconds);
                System.out.flush();
            }
        } catch (Exception error) {
            System.exit(1);
        }
        System.exit(0);
    }
}
