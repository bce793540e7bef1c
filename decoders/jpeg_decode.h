// JPEG decoding for the image pipeline: header inspection (TurboJPEG), choice of a DCT-domain
// scaling factor, and decoding of just the pixel rectangle a crop needs; plus encode_jpeg, the one
// TurboJPEG encoder of make-dataset, the benchmarks and the tests.
//
// Contract: free functions; every call uses thread_local decoder state (a TurboJPEG handle and a
// libjpeg decompressor per thread), so any number of threads may call them at once. The pixels a
// call returns live in a thread_local buffer owned by this module and stay valid until the same
// thread calls decode_jpeg_region() again. Bad data throws SampleError(name, reason).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "decoders/pixel_rect.h"
#include "decoders/rgb_view.h"

namespace batchcast {

// True when the bytes start with a JPEG SOI marker followed by another marker.
bool looks_like_jpeg(const uint8_t* data, size_t size);

// True when an EOI marker (FF D9) ends the data, possibly followed by a little padding: a JPEG
// without it is truncated. check_sample (sample_check.h) runs it for every decoder.
bool has_end_marker(const uint8_t* data, size_t size);

struct JpegHeader {
  int width = 0;
  int height = 0;
  int subsampling = 0;  // TJSAMP_*
  int colorspace = 0;   // TJCS_*
  // CMYK or YCCK (Adobe): libjpeg and nvJPEG cannot convert these to RGB; decode_jpeg_full_turbo
  // does.
  bool cmyk() const { return colorspace == 3 || colorspace == 4; }  // TJCS_CMYK, TJCS_YCCK
};

// Reads the frame header without decoding pixels. Throws SampleError on a malformed header.
JpegHeader read_jpeg_header(const uint8_t* data, size_t size, const std::string& name);

// A DCT-domain scaling factor num/denom (<= 1) from tjGetScalingFactors().
struct ScalingFactor {
  int num = 1;
  int denom = 1;
  int scale(int dim) const { return static_cast<int>((int64_t{dim} * num + denom - 1) / denom); }
};

// The largest reduction worth doing for a crop of crop_w x crop_h source pixels that will be
// resized to out_w x out_h: none unless the crop is at least twice the output in both dimensions;
// otherwise the smallest factor whose scaled crop is still >= the output in both dimensions (so the
// final resize still only shrinks, and quality stays that of a bilinear downscale).
ScalingFactor choose_scaling(int crop_w, int crop_h, int out_w, int out_h);

// Decodes `rect` (in the coordinates of the image scaled by `factor`) as RGB. YCbCr and grayscale
// files are decoded with libjpeg's jpeg_crop_scanline/jpeg_skip_scanlines so only the rows down to
// the rectangle's bottom are entropy-decoded and only its columns are inverse-transformed; CMYK and
// YCCK files take a full TurboJPEG decode (converted to RGB here) and are cropped after.
// Corrupt data in the decoded part throws SampleError; truncation below the rectangle is not
// seen here: run check_sample (sample_check.h, the end-of-image marker) on the bytes first.
RgbView decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name,
                           const JpegHeader& header, ScalingFactor factor, PixelRect rect);

// Decodes the whole image scaled by `factor` with TurboJPEG (the reference path; also used by
// tests). Returns a tightly packed RGB view in the same thread_local buffer.
RgbView decode_jpeg_full_turbo(const uint8_t* data, size_t size, const std::string& name,
                               ScalingFactor factor);

// Encodes `height` rows of `width` RGB8 pixels (gray8 with `gray`, always TJSAMP_GRAY then),
// `stride` bytes apart, as a JPEG of `quality` with TJSAMP_* `subsampling` and TJFLAG_* `flags`
// (a thread_local TurboJPEG compressor). Throws Error with TurboJPEG's message on failure.
std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int width, int height, size_t stride,
                                 bool gray, int quality, int subsampling, int flags = 0);

}  // namespace batchcast
