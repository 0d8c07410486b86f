# A Ruby method calling a C extension (zlib) in a loop: its native frames
# stand above the Ruby frame that called it.
require "zlib"

class Packer
  def squeeze(data)
    Zlib::Deflate.deflate(data, Zlib::BEST_COMPRESSION)
  end
end

data = (0...400_000).map { |i| ((i * 7919) % 251).chr }.join
packer = Packer.new
STDOUT.puts "ready"
STDOUT.flush
loop { packer.squeeze(data) }
