"""Language identification on short text: our detector (searchjax.rewards.rubrics.detect_language) and the
candidate libraries, on the hand-written texts of searchjax.testing.short_texts, in one run.

Candidates that are not installed are skipped (install them in a scratch venv to compare:
`pip install lingua-language-detector langdetect py3langid`). Every candidate is restricted to the 17 languages
the rubrics name. Prints accuracy, errors and ms per text.

    python tools/bench_langid.py
"""

from __future__ import annotations

import importlib.util
import time

from searchjax.rewards.rubrics import LANGUAGES, detect_language
from searchjax.testing.short_texts import SHORT_TEXTS, TINY_TEXTS

LANGS = sorted(LANGUAGES)


def _lingua():
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    det = LanguageDetectorBuilder.from_iso_codes_639_1(*[getattr(IsoCode639_1, x.upper()) for x in LANGS]).build()

    def detect(text: str) -> str:
        lang = det.detect_language_of(text)
        return "und" if lang is None else lang.iso_code_639_1.name.lower()

    return detect


def _langdetect():
    from langdetect import DetectorFactory, detect_langs
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0

    def detect(text: str) -> str:
        try:
            for c in detect_langs(text):
                code = {"zh-cn": "zh", "zh-tw": "zh"}.get(c.lang, c.lang)
                if code in LANGUAGES:
                    return code
        except LangDetectException:
            pass
        return "und"

    return detect


CANDIDATES = {"searchjax (py3langid)": (None, lambda: detect_language), "lingua": ("lingua", _lingua),
              "langdetect": ("langdetect", _langdetect)}


def main() -> None:
    for set_name, texts in (("short sentences", SHORT_TEXTS), ("1-3 word phrases", TINY_TEXTS)):
        n = sum(map(len, texts.values()))
        print(f"{set_name}: {n} texts in {len(texts)} languages")
        for name, (module, make) in CANDIDATES.items():
            if module and importlib.util.find_spec(module) is None:
                print(f"  {name:24s} not installed, skipped")
                continue
            detect = make()
            detect("warm up")
            t0 = time.perf_counter()
            errors = [(lang, t, detect(t)) for lang, ts in texts.items() for t in ts if detect(t) != lang]
            ms = 1e3 * (time.perf_counter() - t0) / n
            print(f"  {name:24s} {n - len(errors)}/{n} = {1 - len(errors) / n:.3f}, {ms:.2f} ms/text; "
                  f"errors {errors[:4]}")


if __name__ == "__main__":
    main()
