// PixelRect: an axis-aligned rectangle of whole pixels, the one rectangle type of decoders/ (crop
// rectangles drawn by crop_params.h, regions decoded by jpeg_decode.h, SampleGeometry's source
// and scaled rectangles). Plain value; thread-safe.
#pragma once

namespace batchcast {

struct PixelRect {
  int left = 0;  // first column
  int top = 0;   // first row
  int width = 0;
  int height = 0;
};

}  // namespace batchcast
