# A busy chain for firn's Ruby tests and bench: a singleton method, an
# instance method, a block given to a C function (Integer#times) and an
# instance method spinning in a loop, called forever from a block of the
# top level. SIGUSR1 makes it print its progress
# (`iterations=N seconds=S`, the bench's measure); SIGTERM ends it.
class Chain
  def self.middle(n)
    new.inner(n)
  end

  def inner(n)
    n.times { |i| work(i) }
  end

  def work(i)
    x = 0
    k = 0
    while k < 20_000 # spin
      x += (i * k) % 7 # spin
      k += 1 # spin
    end
    $iterations += 1
    x
  end
end

$iterations = 0
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
Signal.trap("USR1") do
  seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  STDOUT.puts "iterations=#{$iterations} seconds=#{seconds}"
  STDOUT.flush
end
Signal.trap("TERM") { exit 0 }
STDOUT.puts "ready"
STDOUT.flush
loop { Chain.middle(1000) }
