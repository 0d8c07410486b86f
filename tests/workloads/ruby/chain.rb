# A busy chain for firn's Ruby tests: a singleton method, an instance
# method, a block given to a C function (Integer#times) and an instance
# method spinning in a loop, called forever from a block of the top level.
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
    x
  end
end

STDOUT.puts "ready"
STDOUT.flush
loop { Chain.middle(1000) }
