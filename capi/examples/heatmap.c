/* Attention weights as a picture, with nothing but qkv and the C library.
 *
 * The seeds' diagnostic, show_heatmaps (queries x keys), in plain C: 24
 * tokens whose queries and keys are the sinusoidal positional encodings of
 * their positions (d = 32), scaled dot-product scores and a causal mask.
 * Nearby positions have similar encodings, so every query attends mostly to
 * itself and its recent neighbours: a band under the diagonal, nothing above
 * it.
 *
 * Usage: qkv_heatmap [OUTPUT_PREFIX]   (default "heatmap")
 * Writes OUTPUT_PREFIX.svg (a heatmap with axes, labels, a colour bar and a
 * tooltip per cell; open it in a browser) and OUTPUT_PREFIX.pgm (binary
 * greyscale, P5, 16 x 16 pixels a cell, dark = heavy), and prints the
 * weights as characters. Exits non-zero if a row does not sum to 1, a
 * masked weight is not 0, or a file cannot be written
 * (ctest -R example_heatmap).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv/qkv.h"

#define N 24  /* tokens: queries and keys */
#define D 32  /* encoding size */
#define CELL 16 /* PGM pixels per cell */

/* ColorBrewer "Reds" (matplotlib's cmap="Reds", the seeds' default), low to
 * high; linear in between. */
static const unsigned char kReds[9][3] = {
    {255, 245, 240}, {254, 224, 210}, {252, 187, 161}, {252, 146, 114}, {251, 106, 74},
    {239, 59, 44},   {203, 24, 29},   {165, 15, 21},   {103, 0, 13}};

static void Red(double t, unsigned char rgb[3]) {
  double x;
  int i, c;
  if (!(t > 0.0)) t = 0.0;
  if (t > 1.0) t = 1.0;
  x = t * 8.0;
  i = (int)x;
  if (i > 7) i = 7;
  for (c = 0; c < 3; ++c) {
    rgb[c] = (unsigned char)floor(kReds[i][c] + (x - i) * (kReds[i + 1][c] - kReds[i][c]) + 0.5);
  }
}

static int WritePgm(const char *path, const float *w, float wmax) {
  FILE *f = fopen(path, "wb");
  int y, x;
  if (!f) return 0;
  fprintf(f, "P5\n# qkv attention weights: rows = queries, columns = keys, dark = heavy\n"
             "%d %d\n255\n", N * CELL, N * CELL);
  for (y = 0; y < N * CELL; ++y) {
    for (x = 0; x < N * CELL; ++x) {
      const float v = w[(y / CELL) * N + x / CELL] / wmax;
      fputc(255 - (int)floor(255.0 * v + 0.5), f);
    }
  }
  return fclose(f) == 0;
}

static int WriteSvg(const char *path, const float *w, float wmax, const char *title) {
  const int cell = 18, left = 64, top = 44, side = N * cell;
  const int bar_x = left + side + 24, bar_w = 16, width = bar_x + bar_w + 56;
  const int height = top + side + 56;
  unsigned char rgb[3];
  FILE *f = fopen(path, "w");
  int i, j;
  if (!f) return 0;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\" "
          "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          width, height, width, height);
  fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">%s</text>\n",
          left + side / 2, title);
  for (i = 0; i < N; ++i) {
    for (j = 0; j < N; ++j) {
      Red(w[i * N + j] / wmax, rgb);
      fprintf(f,
              "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#%02x%02x%02x\">"
              "<title>query %d, key %d: %.4f</title></rect>\n",
              left + j * cell, top + i * cell, cell, cell, rgb[0], rgb[1], rgb[2], i, j,
              w[i * N + j]);
    }
  }
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
             "stroke=\"black\"/>\n", left, top, side, side);
  for (i = 0; i < N; i += 4) { /* ticks at the cell centres, as imshow */
    const int c = i * cell + cell / 2;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
               "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
            left + c, top + side, left + c, top + side + 4, left + c, top + side + 17, i);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
               "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%d</text>\n",
            left - 4, top + c, left, top + c, left - 7, top + c + 4, i);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">Keys</text>\n",
          left + side / 2, top + side + 38);
  fprintf(f, "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" "
             "transform=\"rotate(-90 18 %d)\">Queries</text>\n", top + side / 2, top + side / 2);
  /* the colour bar: 0 at the bottom, wmax at the top */
  fprintf(f, "<defs><linearGradient id=\"reds\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">");
  for (i = 0; i < 9; ++i) {
    fprintf(f, "<stop offset=\"%.3f\" stop-color=\"#%02x%02x%02x\"/>", i / 8.0, kReds[i][0],
            kReds[i][1], kReds[i][2]);
  }
  fprintf(f, "</linearGradient></defs>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
             "fill=\"url(#reds)\" stroke=\"black\"/>\n", bar_x, top, bar_w, side);
  for (i = 0; i <= 4; ++i) {
    const int y = top + side - i * side / 4;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
               "<text x=\"%d\" y=\"%d\">%.2f</text>\n",
            bar_x + bar_w, y, bar_x + bar_w + 4, y, bar_x + bar_w + 7, y + 4, (double)wmax * i / 4.0);
  }
  fprintf(f, "</svg>\n");
  return fclose(f) == 0;
}

int main(int argc, char **argv) {
  const char *prefix = argc > 1 ? argv[1] : "heatmap";
  static const char kShades[] = " .:-=+*#%@";
  float x[N * D], weights[N * N], out[N * D], wmax = 0.0f;
  char *path;
  qkv_attention_desc desc;
  size_t bytes;
  void *ws;
  qkv_status st;
  int i, j, bad = 0;

  /* p[i][2c] = sin(i / 10000^(2c/D)), p[i][2c+1] = cos(...) */
  for (i = 0; i < N; ++i) {
    for (j = 0; j < D / 2; ++j) {
      const double angle = i / pow(10000.0, 2.0 * j / D);
      x[i * D + 2 * j] = (float)sin(angle);
      x[i * D + 2 * j + 1] = (float)cos(angle);
    }
  }
  qkv_attention_desc_init(&desc, 1, 1, 1, N, N, D, D);
  desc.mask = QKV_MASK_CAUSAL;
  desc.scale = 1.0f; /* sharper than 1/sqrt(D) = 0.18: a clearer band */
  bytes = qkv_attention_workspace_size(&desc);
  ws = bytes ? malloc(bytes) : NULL;
  st = qkv_attention_f32(&desc, x, x, x, out, weights, NULL, ws, bytes);
  free(ws);
  if (st != QKV_OK) {
    fprintf(stderr, "qkv_attention_f32: %s\n", qkv_status_string(st));
    return 1;
  }

  for (i = 0; i < N; ++i) {
    double sum = 0.0;
    for (j = 0; j < N; ++j) {
      sum += weights[i * N + j];
      if (weights[i * N + j] > wmax) wmax = weights[i * N + j];
      if (j > i && weights[i * N + j] != 0.0f) ++bad;
    }
    if (fabs(sum - 1.0) > 1e-5) ++bad;
  }
  printf("causal self-attention of %d sinusoidal positions on %s\n"
         "(rows: queries 0..%d, columns: keys 0..%d; ' ' = 0 .. '@' = %.3f)\n",
         N, qkv_backend(), N - 1, N - 1, wmax);
  for (i = 0; i < N; ++i) {
    printf("%3d |", i);
    for (j = 0; j < N; ++j) {
      const int s = (int)floor(weights[i * N + j] / wmax * 9.0 + 0.5);
      putchar(kShades[s]);
      putchar(kShades[s]);
    }
    printf("|\n");
  }

  path = malloc(strlen(prefix) + 5);
  if (!path) return 1;
  sprintf(path, "%s.svg", prefix);
  if (!WriteSvg(path, weights, wmax,
                "qkv attention weights: causal, sinusoidal positions")) {
    fprintf(stderr, "cannot write %s\n", path);
    bad = -1;
  } else {
    printf("wrote %s\n", path);
  }
  sprintf(path, "%s.pgm", prefix);
  if (!WritePgm(path, weights, wmax)) {
    fprintf(stderr, "cannot write %s\n", path);
    bad = -1;
  } else {
    printf("wrote %s\n", path);
  }
  free(path);
  if (bad > 0) fprintf(stderr, "FAILED: %d rows or masked weights are wrong\n", bad);
  return bad == 0 ? 0 : 2;
}
