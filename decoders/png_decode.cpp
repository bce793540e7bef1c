// PNG through libpng's full API (the simplified png_image API composites alpha and linearises
// 16-bit data, which PIL does not). libpng reports errors by longjmp: decode_rows() holds every
// libpng call and creates no C++ object after its setjmp.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "decoders/format_decoders.h"
#include "decoders/pil_convert.h"
#include "decoders/sample_check.h"

namespace batchcast {
namespace {

struct PngInput {
  const uint8_t* data;
  size_t size;
  size_t at;
  char message[256];
};

void read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* input = static_cast<PngInput*>(png_get_io_ptr(png));
  if (input->size - input->at < n) png_error(png, "the data ends early");
  std::memcpy(out, input->data + input->at, n);
  input->at += n;
}

void on_error(png_structp png, png_const_charp message) {
  auto* input = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(input->message, sizeof(input->message), "%s", message);
  png_longjmp(png, 1);
}

// Ancillary-chunk problems (bad CRC in a text chunk, an odd iCCP): the pixels are intact, and PIL
// ignores them too.
void on_warning(png_structp, png_const_charp) {}

// One read struct and its info struct.
class PngReader {
 public:
  explicit PngReader(PngInput* input) {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, input, on_error, on_warning);
    if (png_ != nullptr) info_ = png_create_info_struct(png_);
  }
  ~PngReader() { png_destroy_read_struct(&png_, info_ ? &info_ : nullptr, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
  png_structp png() const { return png_; }
  png_infop info() const { return info_; }

 private:
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

// The decoded rows before conversion: 1 (gray), 2 (gray + alpha), 3 (RGB) or 4 (RGBA) channels
// of 8 or 16 bits (big-endian), `row_bytes` apart.
struct RawImage {
  uint32_t width = 0;
  uint32_t height = 0;
  int channels = 0;
  int bit_depth = 0;
  size_t row_bytes = 0;
  uint8_t* rows = nullptr;
};

// Palettes expanded to RGB (with tRNS to alpha, which is then dropped) and 1/2/4-bit grayscale
// to 8 bits (scaled to 0..255 as PIL's L;2 and L;4 are; 1-bit is PIL's mode "1": 0 or 255).
// Returns false with input->message set on any libpng error.
bool decode_rows(const PngReader& reader, PngInput* input, const DecodeTarget& target,
                 ScratchBuffer& raw_buffer, RawImage* raw) {
  png_structp png = reader.png();
  png_infop info = reader.info();
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, input, read_bytes);
  // The header's size passed the bomb guard (check_sample); libpng must not believe another.
  png_set_user_limits(png, PNG_USER_WIDTH_MAX, PNG_USER_HEIGHT_MAX);
  png_read_info(png, info);
  raw->width = png_get_image_width(png, info);
  raw->height = png_get_image_height(png, info);
  if (png_get_color_type(png, info) == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (png_get_color_type(png, info) == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  raw->channels = png_get_channels(png, info);
  raw->bit_depth = png_get_bit_depth(png, info);
  raw->row_bytes = png_get_rowbytes(png, info);
  // Guarded before the raw rows are allocated (throws SampleError; no libpng call is in flight).
  check_pixel_count(raw->width, raw->height, target.max_image_pixels, target.name);
  raw->rows = raw_buffer.get(raw->row_bytes * raw->height);
  for (int pass = 0; pass < passes; ++pass) {
    for (uint32_t y = 0; y < raw->height; ++y)
      png_read_row(png, raw->rows + y * raw->row_bytes, nullptr);
  }
  return true;
}

}  // namespace

RgbView decode_png(const uint8_t* data, size_t size, const DecodeTarget& target) {
  PngInput input{data, size, 0, {0}};
  PngReader reader(&input);
  if (reader.png() == nullptr || reader.info() == nullptr)
    throw Error("libpng could not create a read struct (out of memory)");
  thread_local ScratchBuffer raw_buffer;
  RawImage raw;
  if (!decode_rows(reader, &input, target, raw_buffer, &raw))
    throw SampleError(target.name, std::string("corrupt or truncated PNG: ") + input.message);
  uint8_t* out = target.allocate(raw.width, raw.height);
  const bool wide = raw.bit_depth == 16;
  const int step = raw.channels * (wide ? 2 : 1);
  for (uint32_t y = 0; y < raw.height; ++y) {
    const uint8_t* in = raw.rows + y * raw.row_bytes;
    uint8_t* o = out + static_cast<size_t>(y) * raw.width * 3;
    for (uint32_t x = 0; x < raw.width; ++x, in += step, o += 3) {
      if (raw.channels >= 3) {  // RGB(A): 16-bit by the high byte (PIL's RGB;16B), alpha dropped
        const int s = wide ? 2 : 1;
        o[0] = in[0];
        o[1] = in[s];
        o[2] = in[2 * s];
      } else if (wide && raw.channels == 1) {  // PIL's mode "I": clipped
        o[0] = o[1] = o[2] = clip_to_8((uint32_t{in[0]} << 8) | in[1]);
      } else {  // gray, gray + alpha (LA;16B: high byte), alpha dropped
        o[0] = o[1] = o[2] = in[0];
      }
    }
  }
  return target.view(static_cast<int>(raw.width), static_cast<int>(raw.height));
}

}  // namespace batchcast
