// Whole-image decoding of the formats other than JPEG that torchvision's ImageFolder accepts
// (PNG, BMP, PPM/PGM/PBM, TIFF, WebP) into RGB8, converted the way PIL's Image.convert("RGB")
// converts what Image.open() reads (Pillow 9.4, the one torchvision's default loader uses on
// Debian 12): grayscale replicated; palettes expanded; alpha dropped, not composited; CMYK as
// PIL's cmyk2rgb; 16-bit RGB by its high byte; 16-bit grayscale (PIL's mode "I") clipped to
// 0..255; PNM maxvals other than 255 rescaled with rounding. EXIF and TIFF orientation and
// gamma/ICC profiles are ignored, as PIL ignores them. decoders/README.md lists the cases and the
// tolerance against torchvision. JPEG has its own cropped decoder (jpeg_decode.h).
//
// Contract: free functions; all decoder state is per call and the pixels live in a thread_local
// buffer of this module, valid until the same thread calls decode_image() again; any number of
// threads may call at once. The bytes are the caller's and only read. Bad data (truncated,
// corrupt, an unsupported variant) throws SampleError(name, reason); the width and height the
// decoder finds are held to `max_image_pixels` (the decompression-bomb guard, sample_check.h)
// before any pixel buffer is allocated. Run check_sample() first: it sniffs `format`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decoders/image_header.h"
#include "decoders/rgb_view.h"

namespace batchcast {

// Decodes the whole image (the first frame or page of an animated WebP or multi-page TIFF, as
// PIL's Image.open does). `format` is not kJpeg or kUnknown.
RgbView decode_image(ImageFormat format, const uint8_t* data, size_t size, const std::string& name,
                     int64_t max_image_pixels);

}  // namespace batchcast
