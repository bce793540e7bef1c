// WebP through libwebp's animation decoder, as Pillow's WebP plugin reads every WebP file: the
// first frame on its canvas, non-premultiplied RGBA, of which convert("RGB") keeps the colour
// channels (alpha dropped, not composited). Truncated or corrupt files fail in the demuxer or
// the decoder.
#include <webp/demux.h>

#include <memory>

#include "common/error.h"
#include "decoders/format_decoders.h"
#include "decoders/sample_check.h"

namespace batchcast {
namespace {

struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* decoder) const { WebPAnimDecoderDelete(decoder); }
};

}  // namespace

RgbView decode_webp(const uint8_t* data, size_t size, const DecodeTarget& target) {
  const std::string& name = target.name;
  // The canvas size, from the bitstream's own header parser, is guarded before the decoder
  // allocates its canvas.
  int width = 0;
  int height = 0;
  if (!WebPGetInfo(data, size, &width, &height))
    throw SampleError(name, "corrupt or truncated WebP (unreadable header)");
  check_pixel_count(width, height, target.max_image_pixels, name);
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) throw Error("libwebp: incompatible library version");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;  // the server parallelises across samples
  const WebPData bytes{data, size};
  std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter> decoder(
      WebPAnimDecoderNew(&bytes, &options));
  if (!decoder) throw SampleError(name, "corrupt or truncated WebP (the demuxer refused it)");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(decoder.get(), &info))
    throw SampleError(name, "corrupt WebP (no canvas information)");
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(decoder.get(), &rgba, &timestamp) || rgba == nullptr)
    throw SampleError(name, "corrupt or truncated WebP (the first frame does not decode)");
  const int w = static_cast<int>(info.canvas_width);
  const int h = static_cast<int>(info.canvas_height);
  uint8_t* out = target.allocate(w, h);
  for (size_t i = 0, n = static_cast<size_t>(w) * h; i < n; ++i) {
    out[i * 3] = rgba[i * 4];
    out[i * 3 + 1] = rgba[i * 4 + 1];
    out[i * 3 + 2] = rgba[i * 4 + 2];
  }
  return target.view(w, h);
}

}  // namespace batchcast
