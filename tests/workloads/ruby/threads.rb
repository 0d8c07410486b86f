# Three Ruby threads, each spinning in a method of its own.
class Spinner
  def red
    spin
  end

  def green
    spin
  end

  def blue
    spin
  end

  private

  def spin
    x = 0
    loop { x = (x + 1) % 1_000_003 }
  end
end

threads = %w[red green blue].map do |name|
  Thread.new do
    Thread.current.name = name
    Spinner.new.public_send(name)
  end
end
STDOUT.puts "ready"
STDOUT.flush
threads.each(&:join)
