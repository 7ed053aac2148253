/* GPU leak check: loads a model on the GPU, then creates, uses and frees a translator
   CYCLES times (default 1000). gpu.sh reads the device's used memory around it.
   Exit status 0 when every call succeeded.
   usage: cycles MODEL_DIR [CYCLES] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tolk.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cycles MODEL_DIR [CYCLES]\n");
        return 2;
    }
    int cycles = argc > 2 ? atoi(argv[2]) : 1000;
    TolkModelOptions mo = tolk_model_options_default();
    mo.device = "cuda";
    TolkModel *model = NULL;
    if (tolk_model_load_with_options(argv[1], &mo, &model) != TOLK_OK) {
        fprintf(stderr, "cycles: %s\n", tolk_last_error());
        return 1;
    }
    const char *text = "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82"; /* 你好。 */
    for (int i = 0; i < cycles; i++) {
        TolkTranslator *translator = NULL;
        TolkTextResult *result = NULL;
        if (tolk_translator_new(model, NULL, &translator) != TOLK_OK ||
            tolk_translate_text(translator, text, NULL, NULL, &result) != TOLK_OK) {
            fprintf(stderr, "cycles: cycle %d: %s\n", i, tolk_last_error());
            return 1;
        }
        tolk_text_result_free(result);
        tolk_translator_free(translator);
    }
    tolk_model_free(model);
    printf("%d translator cycles on %s\n", cycles, argv[1]);
    return 0;
}
